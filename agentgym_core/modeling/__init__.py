"""From-scratch models and tokenizers, built offline from an environment's text (DESIGN.md 9).

Imports torch and transformers, so the core imports this package only when a
model is built.
"""

from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.modeling.tokenizer import CHAT_FORMATS, train_tokenizer

__all__ = ["CHAT_FORMATS", "TinyModelConfig", "env_corpus", "init_model", "train_tokenizer"]
