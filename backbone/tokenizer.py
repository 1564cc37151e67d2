"""A small text tokenizer trained on the dataset's own text (task strings, questions, answers).

Used when the backbone is trained from scratch; a pretrained backbone brings its own tokenizer.
Special tokens are looked up by name on the tokenizer, never hard-coded as ids.
"""

from __future__ import annotations

from collections.abc import Iterable

SPECIAL_TOKENS = {"pad_token": "[PAD]", "bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]"}


def train_text_tokenizer(texts: Iterable[str], vocab_size: int = 1000):
    """Train a lower-casing BPE tokenizer on `texts`; returns a transformers PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("no text to train the tokenizer on")
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"], end_of_word_suffix="</w>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()  # words and punctuation apart
    tokenizer.decoder = decoders.BPEDecoder(suffix="</w>")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        end_of_word_suffix="</w>",
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)
