"""GPU and model catalog: datasheet figures, preset shapes and parameter counts against published numbers."""

import pytest

from simulator.catalog.gpus import get_gpu, gpu_names
from simulator.catalog.models import MEGATRON_SC21_NAMES, ModelSpec, get_model, megatron_param_formula, model_names
from simulator.errors import ScenarioError
from simulator.schedules.registry import get_schedule

# Narayanan et al., SC21, Table 1 (copied from shared/reference/megatron_sc21_table1.csv):
# (preset, params in billions as printed, heads, hidden, layers).
SC21_TABLE1 = [
    ("megatron-1.7b", 1.7, 24, 2304, 24),
    ("megatron-3.6b", 3.6, 32, 3072, 30),
    ("megatron-7.5b", 7.5, 32, 4096, 36),
    ("megatron-18.4b", 18.4, 48, 6144, 40),
    ("megatron-39.1b", 39.1, 64, 8192, 48),
    ("megatron-76.1b", 76.1, 80, 10240, 60),
    ("megatron-145.6b", 145.6, 96, 12288, 80),
    ("megatron-310.1b", 310.1, 128, 16384, 96),
    ("megatron-529.6b", 529.6, 128, 20480, 105),
    ("megatron-1t", 1008.0, 160, 25600, 128),
]


def test_gpu_figures_match_datasheets():
    # Dense peaks and bandwidths from shared/reference/hardware.md (NVIDIA datasheets); capacities are
    # nvidia-smi's memory.total in MiB.
    mib = 2.0**20
    expected = {
        "a100-40gb": (312e12, None, 40960 * mib, 1.555e12),
        "a100-80gb": (312e12, None, 81920 * mib, 2.039e12),
        "h100-sxm": (989e12, 1979e12, 81559 * mib, 3.35e12),
        "h200": (989e12, 1979e12, 143771 * mib, 4.8e12),
        # HBM: NVIDIA's current HGX B200 per-GPU figure, 7.7 TB/s (the driver's 7,680-bit bus, pytorch/ao#4002)
        "b200": (2250e12, 4500e12, 183359 * mib, 7.7e12),
        # GB200 NVL72's rack totals over its 72 GPUs, sparse figures halved: 360 PFLOP/s sparse BF16 -> 2.5 P,
        # 720 sparse FP8 -> 5 P, 576 TB/s -> 8 TB/s; nvidia-smi's 189,471 MiB (the 186 GB part)
        "gb200": (2500e12, 5000e12, 189471 * mib, 8.0e12),
    }
    assert set(gpu_names()) == set(expected)
    for name, (bf16, fp8, hbm, bandwidth) in expected.items():
        gpu = get_gpu(name)
        assert gpu.peak("bf16") == pytest.approx(bf16)
        assert gpu.peak("fp16") == pytest.approx(bf16)
        assert gpu.hbm_bytes == pytest.approx(hbm)
        assert gpu.hbm_bandwidth == pytest.approx(bandwidth)
        assert gpu.peak("fp32") < gpu.peak("tf32") < gpu.peak("bf16")
        if fp8 is None:
            with pytest.raises(ScenarioError) as info:
                gpu.peak("fp8")
            assert "bf16" in info.value.allowed
        else:
            assert gpu.peak("fp8") == pytest.approx(fp8)
    # TF32: the HGX B200's 2.2 PFLOP/s sparse, halved; the GB200 NVL72's 180 PFLOP/s sparse over 72, halved
    assert get_gpu("b200").peak("tf32") == pytest.approx(1100e12)
    assert get_gpu("gb200").peak("tf32") == pytest.approx(1250e12)


def test_gb200_racks_run_the_gb200_not_the_hgx_b200():
    """The GB200 NVL72 rack (the topology file and the nvl72 builder's default) holds GB200 GPUs, whose 1,200 W part
    peaks a tenth above the HGX B200's 1,000 W one, not the HGX B200."""
    from simulator.topology.builders import NVL72_PARAMETERS
    from simulator.topology.loader import load_topology

    assert load_topology("gb200-nvl72").gpu_model == NVL72_PARAMETERS["gpu_model"].default == "gb200"
    assert get_gpu("gb200").peak("bf16") / get_gpu("b200").peak("bf16") == pytest.approx(2500 / 2250)


def test_unknown_gpu_lists_the_catalog():
    with pytest.raises(ScenarioError) as info:
        get_gpu("v100")
    assert info.value.field == "cluster.gpu_model"
    assert "h100-sxm" in info.value.allowed and "b200" in info.value.allowed


def test_unknown_model_lists_the_presets():
    with pytest.raises(ScenarioError) as info:
        get_model("llama3-7b")
    assert info.value.field == "model.preset"
    assert "llama3-8b" in info.value.allowed and "megatron-1t" in info.value.allowed


@pytest.mark.parametrize("get, name, problem, field", [
    (get_gpu, "v100", "unknown GPU 'v100'", "cluster.gpu_model"),
    (get_model, "llama3-7b", "unknown model preset 'llama3-7b'", "model.preset"),
    (get_schedule, "pipedream", "unknown schedule 'pipedream'", "parallelism.pipeline.schedule"),
])
def test_every_registry_refuses_an_unknown_name_alike(get, name, problem, field):
    """One rule (errors.lookup) for "unknown X 'foo'", its field and the names allowed, as architecture.md says."""
    with pytest.raises(ScenarioError) as info:
        get(name)
    assert (info.value.problem, info.value.field) == (problem, field) and info.value.allowed.count(", ") >= 4


def test_llama3_shapes_and_params():
    # Llama 3 paper: 8B ~8.03e9 (seed 003), 70B ~70.6e9, 405B ~405.8e9 (Meta model cards).
    for name, params in (("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.8e9)):
        model = get_model(name)
        assert model.gated_mlp and not model.tied_embeddings and not model.learned_positions
        assert model.kv_heads == 8 and model.vocab == 128256 and model.head_dim == 128
        assert model.num_params() == pytest.approx(params, rel=0.002)
    big = get_model("llama3-405b")
    assert (big.layers, big.hidden, big.ffn_hidden, big.heads) == (126, 16384, 53248, 128)


def test_gpt3_175b_params():
    # Brown et al. 2020: 175B parameters; with the vocabulary padded to 51,200 the count is ~174.6e9.
    model = get_model("gpt3-175b")
    assert not model.gated_mlp and model.ffn_hidden == 4 * model.hidden
    assert model.num_params() == pytest.approx(175e9, rel=0.01)


@pytest.mark.parametrize("name, printed_b, heads, hidden, layers", SC21_TABLE1)
def test_megatron_presets_reproduce_table1(name, printed_b, heads, hidden, layers):
    model = get_model(name)
    assert (model.heads, model.hidden, model.layers, model.vocab) == (heads, hidden, layers, 51200)
    assert model.learned_positions and model.max_positions == 2048 and model.ffn_hidden == 4 * hidden
    formula = megatron_param_formula(layers, hidden, 51200, 2048)
    # The preset's count equals the paper's formula up to the final norm (2h), which the formula omits.
    assert model.num_params() - formula == pytest.approx(2 * hidden, abs=1)
    # The table prints the formula's value rounded to 0.1 B (1.652 -> "1.7"), so allow half a printed digit,
    # and 1% for every row from 7.5B up.
    assert abs(formula / 1e9 - printed_b) <= 0.05 + 1e-9
    if printed_b >= 7.5:
        assert formula == pytest.approx(printed_b * 1e9, rel=0.01)


def test_catalog_lists_every_preset():
    assert set(MEGATRON_SC21_NAMES) <= set(model_names())
    assert {"llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b"} <= set(model_names())


def test_bad_custom_model_is_a_scenario_error():
    with pytest.raises(ScenarioError) as info:
        ModelSpec("odd", 2, 100, 400, 3, 3, 1000, gated_mlp=False)
    assert info.value.field == "model.heads"
    with pytest.raises(ScenarioError):
        ModelSpec("odd", 2, 96, 384, 3, 3, 1000, gated_mlp=False, norm="batchnorm")
