"""A small text tokenizer built from the dataset's own text (task strings, questions, answers).

Used when the backbone is trained from scratch; a pretrained backbone brings its own tokenizer.
The vocabulary is built deterministically in Python (the `tokenizers` BPE trainer breaks frequency
ties differently in every process, which would change token ids between identical runs): special
tokens, every character (alone and as a word-piece continuation, so unseen words still encode), then
the most frequent words. Special tokens are looked up by name on the tokenizer, never as literals.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

SPECIAL_TOKENS = {"pad_token": "[PAD]", "bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]"}
_WORDS = re.compile(r"\w+|[^\w\s]")  # what the Whitespace pre-tokenizer produces: words and punctuation


def train_text_tokenizer(texts: Iterable[str], vocab_size: int = 1000):
    """Build a lower-casing word-piece tokenizer from `texts`; returns a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Counter(w for text in texts if text for w in _WORDS.findall(text.lower()))
    if not words:
        raise ValueError("no text to build the tokenizer from")
    vocab = list(SPECIAL_TOKENS.values())
    chars = sorted({c for w in words for c in w})
    vocab += [piece for c in chars for piece in (c, f"##{c}")]
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} cannot hold the {len(vocab)} special and character tokens")
    frequent = sorted((w for w in words if len(w) > 1), key=lambda w: (-words[w], w))
    vocab += frequent[: vocab_size - len(vocab)]
    tokenizer = Tokenizer(
        models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token=SPECIAL_TOKENS["unk_token"])
    )
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)
