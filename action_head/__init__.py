"""dvla.action_head: action heads behind one interface (`base.ActionHead`), picked by `model.head.type`.

Importing this package registers the heads below; a new head is one module added to the list.
"""

from dvla.action_head.base import HEADS, ActionHead, HeadConfig, build_head, register_head
from dvla.action_head.discrete import DiscreteHead, DiscreteHeadConfig
from dvla.action_head.factored import FactoredHead, FactoredHeadConfig
from dvla.action_head.flow import FlowHead, FlowHeadConfig
from dvla.action_head.tokenizer import ActionTokenizer

__all__ = [
    "HEADS",
    "ActionHead",
    "ActionTokenizer",
    "DiscreteHead",
    "DiscreteHeadConfig",
    "FactoredHead",
    "FactoredHeadConfig",
    "FlowHead",
    "FlowHeadConfig",
    "HeadConfig",
    "build_head",
    "register_head",
]
