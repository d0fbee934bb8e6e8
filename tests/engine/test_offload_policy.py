"""Offload policy, CLI parsing, placement and the automatic policy: pure functions, no model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.offload import OffloadPolicy, Tier, auto_policy, cache_host_layers, free_memory, parse_offload, place
from engine.offload.kv_cache import next_host_layer
from engine.offload.placement import choose_tier, place_layer

MiB = 2**20
# One SmolLM2-135M layer in fp32, in registration order: q, k, v, o, gate, up, down, two norms (bytes).
SMOL_LAYER = [331776 * 4, 110592 * 4, 110592 * 4, 331776 * 4, 884736 * 4, 884736 * 4, 884736 * 4, 576 * 4, 576 * 4]


# --- OffloadPolicy ---------------------------------------------------------------------------------


def test_policy_defaults_are_no_offload():
    p = OffloadPolicy()
    assert (p.weights_gpu_percent, p.weights_cpu_percent, p.weights_disk_percent) == (100, 0, 0)
    assert p.cache_gpu_percent == 100 and p.cache_cpu_percent == 0
    assert p.is_resident and p.pin_cpu_weights and p.overlap


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(weights_gpu_percent=101), "between 0 and 100"),
        (dict(weights_cpu_percent=-1), "between 0 and 100"),
        (dict(cache_gpu_percent=150), "between 0 and 100"),
        (dict(weights_gpu_percent=60, weights_cpu_percent=50), "more than 100%"),
        (dict(weights_gpu_percent=50.5), "integer percentage"),
        (dict(weights_gpu_percent=True), "integer percentage"),
        (dict(overlap="yes"), "True or False"),
        (dict(pin_cpu_weights=1), "True or False"),
    ],
)
def test_policy_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OffloadPolicy(**kwargs)


def test_policy_is_frozen():
    with pytest.raises(AttributeError):
        OffloadPolicy().weights_gpu_percent = 0  # type: ignore[misc]


# --- parse_offload ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("weights=0,50 cache=100", OffloadPolicy(0, 50, 100)),
        ("cache=25 weights=30%,20%", OffloadPolicy(30, 20, 25)),
        ("weights=0,0", OffloadPolicy(0, 0, 100)),
        ("cache=0", OffloadPolicy(100, 0, 0)),
        ("weights=0,100;cache=50", OffloadPolicy(0, 100, 50)),
        ("WEIGHTS=10,10 pin=off overlap=off", OffloadPolicy(10, 10, 100, pin_cpu_weights=False, overlap=False)),
    ],
)
def test_parse_offload(text, expected):
    assert parse_offload(text) == expected


@pytest.mark.parametrize(
    "policy",
    [OffloadPolicy(), OffloadPolicy(0, 50, 100), OffloadPolicy(10, 20, 30, pin_cpu_weights=False, overlap=False)],
)
def test_spec_round_trips(policy):
    assert parse_offload(policy.spec()) == policy


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("weights=50", "two percentages"),
        ("weights=a,b", "whole percentage"),
        ("weights=60,60", "more than 100%"),
        ("cache", "key=value"),
        ("colour=red", "unknown offload policy key"),
        ("cache=10 cache=20", "twice"),
        ("overlap=maybe", "on or off"),
        ("cache=200", "between 0 and 100"),
    ],
)
def test_parse_offload_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_offload(text)


def test_describe_names_every_share():
    assert OffloadPolicy(0, 50, 75).describe() == "weights 0% GPU, 50% CPU, 50% disk; KV cache 75% GPU"


# --- place -------------------------------------------------------------------------------------------


def test_choose_tier_boundaries():
    assert choose_tier(0.0, 0, 0) is Tier.DISK
    assert choose_tier(49.9, 50, 0) is Tier.GPU
    assert choose_tier(50.0, 50, 0) is Tier.DISK  # shares are half-open: [0, gpu), [gpu, gpu+cpu), rest
    assert choose_tier(50.0, 50, 10) is Tier.CPU


@pytest.mark.parametrize("gpu, cpu, tier", [(100, 0, Tier.GPU), (0, 100, Tier.CPU), (0, 0, Tier.DISK)])
def test_place_whole_tiers(gpu, cpu, tier):
    p = place([SMOL_LAYER] * 3, OffloadPolicy(gpu, cpu))
    assert all(t is tier for layer in p.tiers for t in layer)
    assert p.bytes_on(tier) == p.total_bytes == 3 * sum(SMOL_LAYER)


def test_place_midpoint_rule_on_a_llama_layer():
    # Cumulative midpoints (percent of the layer): q 4.7, k 10.9, v 14.1, o 20.3, gate 37.5, up 62.5,
    # down 87.5, norms ~100. With 50% on CPU: q..gate to CPU, up/down/norms to disk.
    p = place([SMOL_LAYER], OffloadPolicy(0, 50))
    C, D = Tier.CPU, Tier.DISK
    assert p.tiers[0] == (C, C, C, C, C, D, D, D, D)
    assert p.percent_on(Tier.CPU) == pytest.approx(49.98, abs=0.01)
    p = place([SMOL_LAYER], OffloadPolicy(20, 30))
    G = Tier.GPU
    assert p.tiers[0] == (G, G, G, C, C, D, D, D, D)


def test_place_equal_sizes_split_exactly():
    p = place([[10] * 10] * 4, OffloadPolicy(30, 40))
    assert [p.layer_bytes_on(0, t) for t in Tier] == [30, 40, 30]
    assert p.bytes_on(Tier.GPU) == 120 and p.bytes_on(Tier.CPU) == 160 and p.bytes_on(Tier.DISK) == 120
    assert p.tiers[0] == p.tiers[3]  # every layer is split the same way


def test_place_overshoot_is_at_most_half_the_largest_tensor():
    sizes = [7, 1, 13, 2, 29, 3, 5]
    for gpu in range(0, 101, 5):
        p = place([sizes], OffloadPolicy(gpu, 0))
        assert abs(p.bytes_on(Tier.GPU) - gpu / 100 * sum(sizes)) <= max(sizes) / 2


def test_place_is_pure_and_handles_empty_layers():
    assert place([], OffloadPolicy(0, 0)).total_bytes == 0
    assert place_layer([0, 0], 0, 0) == (Tier.GPU, Tier.GPU)
    with pytest.raises(ValueError):
        place_layer([4, -1], 50, 0)
    a = place([SMOL_LAYER] * 2, OffloadPolicy(10, 10))
    assert a == place([SMOL_LAYER] * 2, OffloadPolicy(10, 10))
    assert "disk" in a.describe()


def test_cache_host_layers():
    assert cache_host_layers(30, 100) == frozenset()
    assert cache_host_layers(30, 0) == frozenset(range(30))
    assert cache_host_layers(4, 50) == {2, 3}  # the last layers go to the CPU
    assert len(cache_host_layers(30, 40)) == 18
    assert next_host_layer((2, 3), 0) == 2
    assert next_host_layer((2, 3), 3) == 3
    assert next_host_layer((2, 3), 4) == 2  # wraps to the first host layer for the next token


# --- auto_policy -------------------------------------------------------------------------------------


def test_auto_everything_fits_on_gpu():
    assert auto_policy(1000 * MiB, 8000 * MiB, 16000 * MiB, resident_bytes=200 * MiB) == OffloadPolicy()


def test_auto_spills_to_cpu_then_disk():
    # 10 GiB of layers, 4 GiB of free GPU, plenty of RAM: GPU share limited, the rest in RAM, no disk.
    p = auto_policy(10240 * MiB, 4096 * MiB, 64000 * MiB, resident_bytes=500 * MiB, layer_bytes=300 * MiB)
    assert 0 < p.weights_gpu_percent < 40 and p.weights_disk_percent == 0 and p.cache_gpu_percent == 100
    gpu_used = 500 + 10240 * p.weights_gpu_percent / 100 + 2 * 300
    assert gpu_used <= 4096 * 0.9
    # Little RAM too: something must go to disk.
    p = auto_policy(10240 * MiB, 4096 * MiB, 4096 * MiB, resident_bytes=500 * MiB, layer_bytes=300 * MiB)
    assert p.weights_disk_percent > 40
    assert 10240 * p.weights_cpu_percent / 100 + 600 <= 4096 * 0.9


def test_auto_keeps_cache_on_gpu_first():
    p = auto_policy(8000 * MiB, 4000 * MiB, 64000 * MiB, cache_bytes=1000 * MiB, layer_bytes=200 * MiB)
    assert p.cache_gpu_percent == 100 and p.weights_gpu_percent > 0
    p = auto_policy(8000 * MiB, 1200 * MiB, 64000 * MiB, cache_bytes=2000 * MiB, layer_bytes=200 * MiB)
    assert 0 < p.cache_gpu_percent < 100 and p.weights_gpu_percent == 0


def test_auto_respects_the_real_placement():
    sizes = [SMOL_LAYER] * 30
    total = 30 * sum(SMOL_LAYER)
    p = auto_policy(total, int(total * 0.6), 64000 * MiB, layer_sizes=sizes)
    assert place(sizes, p).bytes_on(Tier.GPU) <= total * 0.6 * 0.9


def test_auto_on_cpu_compute():
    assert auto_policy(400 * MiB, None, 8000 * MiB, resident_bytes=100 * MiB) == OffloadPolicy(0, 100)
    p = auto_policy(4000 * MiB, None, 2000 * MiB, resident_bytes=100 * MiB, layer_bytes=100 * MiB)
    assert p.weights_gpu_percent == 0 and 0 < p.weights_cpu_percent < 50 and p.cache_gpu_percent == 100


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((0, 100, 100), {}, "positive"),
        ((100 * MiB, 100 * MiB, 1000 * MiB), dict(resident_bytes=200 * MiB), "do not fit in free GPU"),
        ((1000 * MiB, 100 * MiB, 1000 * MiB), dict(layer_bytes=100 * MiB), "two decoder layers"),
        ((1000 * MiB, None, 100 * MiB), dict(resident_bytes=200 * MiB), "do not fit in free memory"),
        ((100, 100, 100), dict(headroom=1.0), "headroom"),
    ],
)
def test_auto_errors(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        auto_policy(*args, **kwargs)


def test_free_memory_reads_this_machine():
    mem = free_memory("cpu")
    assert mem.free_gpu_bytes is None and mem.free_cpu_bytes > 64 * MiB


def test_policy_side_imports_no_ml_framework():
    """The CLI and the app parse and plan without torch: importing engine.offload must not load it."""
    code = (
        "import sys, engine.offload as o; o.parse_offload('weights=0,50'); o.auto_policy(10, None, 100); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "[]"
