"""dvla.action_head: discrete action bins (default) and a flow-matching head."""

from dvla.action_head.flow import FlowHeadConfig, FlowMatchingHead
from dvla.action_head.tokenizer import ActionTokenizer

__all__ = ["ActionTokenizer", "FlowHeadConfig", "FlowMatchingHead"]
