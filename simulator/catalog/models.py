"""Transformer model presets (Llama 3, GPT-3, the Megatron-LM SC21 Table 1 sizes) and parameter counting.

Shapes come from the Llama 3 paper (8B/70B/405B: RMSNorm, SwiGLU, GQA with 8 KV heads, RoPE, untied output
layer), GPT-3 (Brown et al. 2020; vocabulary padded to 51,200 as Megatron-LM does) and Narayanan et al. SC21
Table 1 (GPT-style: LayerNorm, biases, GeLU MLP of 4h, learned positions for 2,048 tokens, tied embeddings,
dropout, vocabulary 51,200).

Mixture-of-experts presets: `mixtral-8x7b` (Mistral AI, "Mixtral of Experts", 2024: 32 layers, hidden 4096,
8 SwiGLU experts of 14,336, top-2, GQA 32/8 heads, vocabulary 32,000; 46.7B parameters, 12.9B active) and
`deepseek-v3-style`, DeepSeek-V3's fine-grained MoE shape (DeepSeek-AI 2024: 61 layers, hidden 7168, 256
routed experts of 2048 plus one shared, top-8, 128 heads, vocabulary 129,280) with two simplifications: plain
multi-head attention instead of MLA, and experts in every layer (DeepSeek-V3 keeps the first three dense).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from simulator.config.model_options import NORMS, Norm
from simulator.errors import ScenarioError, lookup


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts MLP: ``experts`` routed experts of width ``expert_ffn_hidden``, ``top_k`` per token,
    ``shared_experts`` always active, a router (one hidden x experts matrix); experts are gated like the
    model's MLP. ``capacity_factor`` caps each expert at CF x tokens x k / E (None: nothing dropped)."""

    experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    capacity_factor: float | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: depth, widths, attention heads (``kv_heads`` < ``heads`` means GQA) and options.

    ``max_positions`` is the length of the learned position table when ``learned_positions`` (GPT style);
    rotary models (Llama) have no position parameters. ``separate_qkv``: q, k and v are three linear layers, as
    Hugging Face's Llama and Mixtral write them (q_proj, k_proj, v_proj), not one packed projection split into
    heads; the configuration cannot say which, so the Llama and Mixtral presets take Hugging Face's layout and
    everything else the packed one. Only the eager backward's copies of their gradients (workload/eager.py)
    differ.
    """

    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int
    gated_mlp: bool
    tied_embeddings: bool = False
    norm: Norm = "rmsnorm"
    bias: bool = False
    learned_positions: bool = False
    max_positions: int = 0
    dropout: bool = False
    moe: MoESpec | None = None
    separate_qkv: bool = False

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"{name} must be at least 1, got {getattr(self, name)}", field=f"model.{name}")
        if self.norm not in NORMS:
            raise ScenarioError(f"unknown norm {self.norm!r}", field="model.preset", allowed=", ".join(NORMS))
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ScenarioError(
                f"hidden {self.hidden}, heads {self.heads}, kv_heads {self.kv_heads} do not divide evenly",
                field="model.heads", allowed="heads dividing hidden, kv_heads dividing heads",
            )
        if self.learned_positions and self.max_positions < 1:
            raise ScenarioError("learned positions need max_positions >= 1", field="model.preset")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    def norm_params(self) -> int:
        """Parameters of one normalisation layer (LayerNorm has a bias, RMSNorm does not)."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def attention_params(self) -> int:
        """Q, K, V and output projection weights (and biases) of one layer."""
        q_width = self.heads * self.head_dim
        kv_width = self.kv_heads * self.head_dim
        weights = self.hidden * (q_width + 2 * kv_width) + q_width * self.hidden
        biases = (q_width + 2 * kv_width + self.hidden) if self.bias else 0
        return weights + biases

    def mlp_params(self) -> int:
        """MLP weights (three matrices when gated, else two) and biases of one layer; with experts, the router
        and every expert, routed and shared."""
        if self.moe is not None:
            return self.router_params() + (self.moe.experts + self.moe.shared_experts) * self.expert_params()
        matrices = 3 if self.gated_mlp else 2
        weights = matrices * self.hidden * self.ffn_hidden
        biases = ((matrices - 1) * self.ffn_hidden + self.hidden) if self.bias else 0
        return weights + biases

    def expert_params(self) -> int:
        """Weights of one expert (0 without experts)."""
        if self.moe is None:
            return 0
        return (3 if self.gated_mlp else 2) * self.hidden * self.moe.expert_ffn_hidden

    def routed_expert_params(self) -> int:
        """Weights of one layer's routed experts, all of them (0 without experts): what EP splits."""
        if self.moe is None:
            return 0
        return self.moe.experts * self.expert_params()

    def router_params(self) -> int:
        """The router's hidden x experts matrix (0 without experts)."""
        return self.hidden * self.moe.experts if self.moe is not None else 0

    def active_params(self) -> int:
        """Parameters one token's computation uses: all of them for a dense model; with experts only top_k
        routed experts (plus the shared ones) per layer."""
        if self.moe is None:
            return self.num_params()
        idle = (self.moe.experts - self.moe.top_k) * self.expert_params()
        return self.num_params() - self.layers * idle

    def layer_params(self) -> int:
        """Parameters of one transformer layer (attention, MLP and its two norms)."""
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params()

    def layer_params_per_ep_rank(self, ep: int) -> float:
        """Parameters of one layer that a rank of an EP group of ``ep`` holds: its share of the routed experts
        (the layer itself without experts)."""
        if self.moe is None:
            return self.layer_params()
        return self.layer_params() - self.routed_expert_params() * (1 - 1 / ep)

    def embedding_params(self) -> int:
        """Token embedding table plus the learned position table, if any."""
        positions = self.max_positions * self.hidden if self.learned_positions else 0
        return self.vocab * self.hidden + positions

    def head_params(self) -> int:
        """Final norm plus the output layer (zero extra weights when tied to the embedding)."""
        output = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.norm_params() + output

    def num_params(self) -> int:
        """Total parameter count, every weight counted once."""
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()


def _llama(name: str, layers: int, hidden: int, ffn: int, heads: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, ffn, heads, kv_heads=8, vocab=128256, gated_mlp=True, separate_qkv=True)


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name, layers, hidden, 4 * hidden, heads, kv_heads=heads, vocab=51200, gated_mlp=False,
        tied_embeddings=True, norm="layernorm", bias=True, learned_positions=True, max_positions=2048, dropout=True,
    )


# Narayanan et al., SC21, Table 1: (name from the params column, heads, hidden, layers).
_MEGATRON_SC21 = (
    ("megatron-1.7b", 24, 2304, 24),
    ("megatron-3.6b", 32, 3072, 30),
    ("megatron-7.5b", 32, 4096, 36),
    ("megatron-18.4b", 48, 6144, 40),
    ("megatron-39.1b", 64, 8192, 48),
    ("megatron-76.1b", 80, 10240, 60),
    ("megatron-145.6b", 96, 12288, 80),
    ("megatron-310.1b", 128, 16384, 96),
    ("megatron-529.6b", 128, 20480, 105),
    ("megatron-1t", 160, 25600, 128),
)

MODELS: MappingProxyType = MappingProxyType({
    spec.name: spec
    for spec in (
        _llama("llama3-8b", 32, 4096, 14336, 32),
        _llama("llama3-70b", 80, 8192, 28672, 64),
        _llama("llama3-405b", 126, 16384, 53248, 128),
        _gpt("gpt3-175b", 96, 12288, 96),
        *(_gpt(name, layers, hidden, heads) for name, heads, hidden, layers in _MEGATRON_SC21),
        ModelSpec("mixtral-8x7b", 32, 4096, 14336, 32, kv_heads=8, vocab=32000, gated_mlp=True, separate_qkv=True,
                  moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=14336)),
        ModelSpec("deepseek-v3-style", 61, 7168, 18432, 128, kv_heads=128, vocab=129280, gated_mlp=True,
                  moe=MoESpec(experts=256, top_k=8, expert_ffn_hidden=2048, shared_experts=1)),
    )
})

MEGATRON_SC21_NAMES = tuple(row[0] for row in _MEGATRON_SC21)


def model_names() -> tuple[str, ...]:
    """Names of the model presets, in catalog order."""
    return tuple(MODELS)


def get_model(name: str, where: str = "model.preset") -> ModelSpec:
    """The preset called ``name``; an unknown name is a ScenarioError listing the presets."""
    return lookup(MODELS, name, "model preset", where)


def megatron_param_formula(layers: int, hidden: int, vocab: int, seq_len: int) -> float:
    """Narayanan et al. (SC21) parameter count P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))."""
    l, h = layers, hidden
    return 12 * l * h**2 * (1 + 13 / (12 * h) + (vocab + seq_len) / (12 * l * h))
