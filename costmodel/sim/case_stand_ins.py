"""What a published case names in words, read as something the simulator can run.

Cases in ``contention.json`` sometimes name a cluster the presets do not have
(``other:h20``, ``other:4xA100|4xH100|4xMI250|4xMI210``) or a job only by its model and
GPU count. :func:`presets_for_other` maps the GPU names of an ``other:`` cluster to the
presets whose GPU is that model (and names the ones no preset models);
:func:`stand_in_spec` and :func:`stand_in_specs` choose the generator job that stands for
a described one. Every choice here is the project's, printed beside the case's verdict.

The rules: the model a text names (``Llama 3 8B``, ``Llama-3.1-8B`` -> ``llama3-8b``;
``Qwen3 32B`` -> its shape from its config; ``GPT`` -> ``phi2``, the generators' GPT-style
decoder); FSDP unless the text says otherwise (the generators build FSDP, TP and EP jobs);
a micro-batch of 2 and a sequence of 4096 where the source states none (the FSDP step
issue 23 measures against); the GPUs the case states. A model the generators cannot
build (a mixture of experts under FSDP) is not judged, with that reason.
"""

from __future__ import annotations

import re

from costmodel.cluster import load_cluster, preset_names
from costmodel.gpu_specs import device_model

OTHER_PREFIX = "other:"
UNSTATED_MICRO_BATCH = 2
UNSTATED_SEQ = 4096
# Qwen/Qwen3-32B config.json (Hugging Face): hidden_size 5120, 64 layers, intermediate_size 25600,
# 64 attention heads, 8 key-value heads, vocab_size 151936
_QWEN3_32B = "hidden=5120,layers=64,ffn=25600,heads=64,kv_heads=8,vocab=151936"
_AMD_MODELS = ("MI", )
# Words naming a fabric no preset has (presets: NVLink/NVSwitch in a node, InfiniBand between nodes)
FABRIC_WORDS = ("socket", "tcp", "ethernet", "pcie", "roce", "efa")


class NotJudged(Exception):
    """The case cannot be judged; the message says why (printed instead of a verdict)."""


def presets_for_other(text: str) -> tuple[list[str], list[str]]:
    """(presets for the GPUs an ``other:`` cluster names, one sentence per GPU no preset models)."""
    names = [t.strip() for t in text[len(OTHER_PREFIX):].split("|") if t.strip()]
    presets: list[str] = []
    missing: list[str] = []
    by_model: dict[str, list[str]] = {}
    for name in preset_names():
        model = device_model(load_cluster(name).gpu.name)
        if model:
            by_model.setdefault(model, []).append(name)
    for token in names:
        bare = re.sub(r"^\d+\s*x\s*", "", token, flags=re.IGNORECASE)
        model = device_model(bare.upper().replace("-", " "))
        fabric = [w for w in FABRIC_WORDS if w in token.lower()]
        if model is not None and fabric:  # every preset is NVLink/NVSwitch inside a node and InfiniBand across
            missing.append(f"{token}: states a fabric ({', '.join(fabric)}) no preset has")
        elif model is None:
            missing.append(f"{token}: names no GPU model")
        elif model.startswith(_AMD_MODELS):
            missing.append(f"{token}: not an NVIDIA GPU")
        elif model in by_model:
            presets.extend(p for p in sorted(by_model[model]) if p not in presets)
        else:
            missing.append(f"{token}: no preset models a {model}")
    return presets, missing


def _model_spec(model: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", model.lower())
    if "gptoss" in key:
        raise NotJudged(f"{model} is a mixture of experts: the generators build experts under expert "
                        "parallelism (ep:) only, not under FSDP")
    if "llama3" in key and "8b" in key:
        return "llama3-8b"
    if "qwen3" in key and "32b" in key:
        return _QWEN3_32B
    raise NotJudged(f"no generator model stands for {model!r}")


def stand_in_spec(model: str | None, parallelism: str | None, gpus: int | None, micro_batch: int | None,
                  seq: int | None) -> str:
    """The generator job that stands for a described one (module docstring's rules)."""
    if not model:
        raise NotJudged("the source does not state the model")
    if gpus is None:
        raise NotJudged("the source does not state the GPUs")
    if parallelism and "fsdp" not in parallelism.lower():
        raise NotJudged(f"parallelism {parallelism!r}: only FSDP jobs have a stand-in")
    mb = micro_batch or UNSTATED_MICRO_BATCH
    return f"fsdp:{_model_spec(model)}:gpus={gpus},mb={mb},seq={seq or UNSTATED_SEQ}"


def stand_in_specs(description: str, default_gpus: int) -> list[str]:
    """The FSDP jobs that stand for a described set of training jobs (``GPT and LLaMA ... on
    4-GPU nodes``): one per model family it names, on the GPUs it names."""
    text = description.lower()
    found = re.search(r"(\d+)[- ]gpu", text)
    gpus = int(found.group(1)) if found else default_gpus
    specs = []
    if "llama" in text:
        specs.append(f"fsdp:llama3-8b:gpus={gpus},mb={UNSTATED_MICRO_BATCH},seq={UNSTATED_SEQ}")
    if "gpt" in text:
        specs.append(f"fsdp:phi2:gpus={gpus}")
    if not specs:
        raise NotJudged(f"no generator job stands for {description!r}")
    return specs


__all__ = ["FABRIC_WORDS", "NotJudged", "OTHER_PREFIX", "presets_for_other", "stand_in_spec", "stand_in_specs"]
