"""llama.cpp behind the Engine interface: ``llama-server`` driven over its HTTP API.

What it runs
------------
``llama-server`` (built by :mod:`specfuzz.engines.llamacpp_build` from the llama.cpp tree that
the pinned llama-cpp-python sdist vendors, or ``$SPECFUZZ_LLAMA_SERVER``) on the case's tables
converted to float32 GGUF files (:mod:`specfuzz.tablegen.gguf_model`), as a user runs it::

    llama-server -m target.gguf [-md draft.gguf --spec-draft-n-max K ...] -np SLOTS -c CTX

Every request is one ``POST /completion`` with the prompt as token ids, ``n_predict``,
``return_tokens``, the request's ``seed`` (when it has one) and every sampler parameter
(:func:`completion_body`): llama-server's own defaults (top-k 40, top-p 0.95, min-p 0.05,
temperature 0.8) are overridden by the off values, so that the ``"llamacpp"`` profile
(:mod:`specfuzz.oracle.semantics_llamacpp`) holds. Requests run concurrently on ``SLOTS``
server slots.

Speculation (server options; llama-server takes none per request):

* ``draft_model``: ``-md draft.gguf --spec-type draft-simple`` with ``--spec-draft-n-max K``
  (and the settings ``draft_n_min`` / ``draft_p_min``); engine default: those two options alone
  (``n_max`` 3). ``-md`` without ``--spec-type`` loads the draft and drafts nothing.
* ``ngram``: ``--spec-type`` (setting ``ngram_type``: ngram-simple, ngram-map-k,
  ngram-map-k4v or ngram-mod) with its size knobs: lookup length ``ngram_max`` and draft
  length ``K``; engine default: ``--spec-type ngram-simple`` alone (lookup 12, draft 48).

llama-server verifies drafts by sampling the target at every drafted position with the
request's whole sampler chain and keeping drafts while they equal the sampled token
(``common_sampler_sample_and_accept_n``): the output law is the target's whatever the draft
proposes, so the oracle's μ is the law speculation must keep.

Tables are checked before any sample: every row's raw probabilities (``n_probs``, taken
before the sampler chain) are read back from the running server and compared with the
table's softmax (:meth:`LlamaCppEngine.check_tables`). A swap is a server restart on the new
GGUF files (llama-server loads one model per process); it keeps the Python process and is
recorded as resetting the KV cache and the slots.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from specfuzz.engines.base import (
    Capabilities, Completion, Engine, EngineConfig, Request, SwapReport, TableCheck, _cpu_model, merged_settings, read_config,
)
from specfuzz.errors import InvalidInput
from specfuzz.oracle.semantics_llamacpp import LLAMACPP_UNSUPPORTED, PENALTY_LAST_N
from specfuzz.oracle.speculative import SpecConfig

ENGINE_NAME = "llama.cpp"
METHODS = ("draft_model", "ngram")
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
SAMPLING = frozenset({
    "temperature", "top_k", "top_p", "min_p", "logit_bias", "repetition_penalty", "frequency_penalty",
    "presence_penalty", "max_tokens", "ignore_eos",
})
# llama-server's defaults when a user passes only the method's required option.
SPEC_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    # -md draft.gguf --spec-type draft-simple: --spec-draft-n-max 3, -n-min 0, -p-min 0.
    "draft_model": {"num_speculative_tokens": 3},
    # --spec-type ngram-simple alone: lookup n-gram 12, draft m-gram 48 (SpecConfig holds at
    # most 16 draft tokens: K=16 is recorded, the server drafts up to 48).
    "ngram": {"num_speculative_tokens": 16, "ngram_min": 12, "ngram_max": 12},
}
# What a server restart (a swap, reset_state) resets.
RESTART_RESETS = ("llama-server restarted: KV and prompt caches, slots, n-gram drafters' state",)
# Tolerance of the table check on log-probabilities (float32 softmax and log).
CHECK_ATOL = 1e-4
# Below this log-probability the float32 softmax underflows: the server reports probability 0.
UNDERFLOW_LOGPROB = -87.0

SETTINGS: dict[str, tuple[Any, str]] = {
    "server": (None, "None (the built llama-server) or a path to a llama-server binary"),
    "llama_cpp_python": (None, "None (the pinned release) or a llama-cpp-python version whose llama.cpp to build"),
    "slots": (4, "an integer in [1, 64] (llama-server -np: requests served at once)"),
    "threads": (1, "an integer >= 1 (llama-server -t / -tb)"),
    "port": (None, "None (a free port) or a free TCP port in [1024, 65535]"),
    "cache_prompt": (True, "True or False (the request's cache_prompt: reuse a slot's KV cache of a common prefix; on by default)"),
    "ngram_type": ("ngram-simple", f"one of {NGRAM_TYPES}"),
    "draft_n_min": (0, "an integer >= 0 (--spec-draft-n-min)"),
    "draft_p_min": (0.0, "a number in [0, 1] (--spec-draft-p-min)"),
    "model_gguf": (None, "None, or the GGUF file of a real (non-table) model whose converted folder is target_dir "
                         "(specfuzz compare: the embedded SmolLM2); speculation: ngram, or draft_model with the target as draft"),
    "extra_args": ((), "a list of further llama-server options (strings), appended to the command line"),
    "start_timeout_s": (120.0, "a number > 0"),
    "request_timeout_s": (300.0, "a number > 0"),
}
PASSTHROUGH_SETTINGS = ("draft_vocab_size", "draft_d2t")


def completion_body(req: Request, vocab_size: int) -> dict[str, Any]:
    """The ``/completion`` JSON for one request: every sampler parameter stated."""
    p = req.params
    for name, off in LLAMACPP_UNSUPPORTED.items():
        if getattr(p, name) != off:
            raise InvalidInput(name, getattr(p, name), f"{off!r}: llama-server has no {name}")
    p.check_vocab(vocab_size)
    body: dict[str, Any] = {
        "prompt": list(req.prompt), "n_predict": p.max_tokens, "return_tokens": True, "stream": False,
        "temperature": 0.0 if p.greedy else p.temperature,
        "top_k": max(p.top_k, 0), "top_p": p.top_p, "min_p": p.min_p,
        "typical_p": 1.0, "xtc_probability": 0.0, "top_n_sigma": -1.0, "dry_multiplier": 0.0, "mirostat": 0,
        "dynatemp_range": 0.0, "repeat_last_n": PENALTY_LAST_N, "repeat_penalty": p.repetition_penalty,
        "frequency_penalty": p.frequency_penalty, "presence_penalty": p.presence_penalty,
        "ignore_eos": p.ignore_eos, "n_probs": 0, "min_keep": 0,
        "logit_bias": [[int(t), float(b)] for t, b in dict(p.logit_bias).items()],
    }
    if req.seed is not None:
        body["seed"] = int(req.seed) & 0xFFFFFFFF
    return body


def server_args(config: EngineConfig, target_gguf: Path, draft_gguf: Path | None, settings: Mapping[str, Any]) -> list[str]:
    """llama-server's options for ``config`` (without the binary, host and port)."""
    slots = int(settings["slots"])
    ctx_per_slot = int(config.max_model_len) + 32
    args = ["-m", str(target_gguf), "-np", str(slots), "-c", str(slots * ctx_per_slot),
            "-t", str(settings["threads"]), "-tb", str(settings["threads"]), "--no-warmup", "--no-webui"]
    args += list(settings.get("extra_args", ()))
    spec = config.speculation
    if spec is None:
        return args
    K = str(spec.num_speculative_tokens)
    if spec.method == "draft_model":
        # -md alone loads the draft but drafts nothing ("no implementations specified for
        # speculative decoding"): the method is named with --spec-type.
        args += ["-md", str(draft_gguf), "--spec-type", "draft-simple"]
        if not spec.engine_default:
            args += ["--spec-draft-n-max", K, "--spec-draft-n-min", str(settings["draft_n_min"]),
                     "--spec-draft-p-min", repr(float(settings["draft_p_min"]))]
        return args
    kind = settings["ngram_type"]
    args += ["--spec-type", kind]
    if spec.engine_default:
        return args
    n = str(spec.ngram_max)
    if kind == "ngram-mod":
        args += ["--spec-ngram-mod-n-match", n, "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", K]
    else:
        flag = kind.replace("ngram-", "--spec-ngram-")
        args += [f"{flag}-size-n", n, f"{flag}-size-m", K]
    return args


# Options of the pinned release -> their names in older llama-server builds (bisect runs those).
OLD_OPTION_NAMES = {"--spec-draft-n-max": "--draft-max", "--spec-draft-n-min": "--draft-min", "--spec-draft-p-min": "--draft-p-min"}
# Options an older build may lack and a run can do without (it drafts with -md alone there).
OPTIONAL_OPTIONS = {"--no-webui": 0, "--spec-type": 1}


def for_server(args: list[str], help_text: str) -> list[str]:
    """``args`` as a llama-server build whose ``--help`` is ``help_text`` takes them: options of
    older releases under their old names, optional ones it lacks left out (with their value)."""
    known = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))
    if not known:
        return list(args)
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and a not in known:
            if OLD_OPTION_NAMES.get(a) in known:
                a = OLD_OPTION_NAMES[a]
            elif a in OPTIONAL_OPTIONS and not (a == "--spec-type" and args[i + 1] != "draft-simple"):
                i += 1 + OPTIONAL_OPTIONS[a]
                continue
        out.append(a)
        i += 1
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def gguf_path(ckpt_dir: Path) -> Path:
    """Where the GGUF of a tablegen checkpoint folder is kept: beside the folder, named by
    the folder and its weights file (size and mtime), so a rewritten folder gets a new file."""
    d = Path(ckpt_dir)
    st = (d / "model.safetensors").stat()
    tag = hashlib.sha256(f"{d.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
    return d.parent / "gguf" / f"{d.name}-{tag}.gguf"


def model_gguf(path: Path, name: str) -> Path:
    """The GGUF to load for a checkpoint: a tablegen folder (converted once) or a GGUF file
    that tablegen wrote; anything else is InvalidInput naming ``name``."""
    from specfuzz.tablegen.gguf_model import gguf_from_checkpoint, read_gguf_info

    p = Path(path)
    if p.is_file():
        info = read_gguf_info(p)
        if not info["table_model"]:
            raise InvalidInput(name, str(p), f"a table-model GGUF written by specfuzz.tablegen (this GGUF is a "
                                             f"{info['architecture'] or 'model'} model without the {'specfuzz.table_model'!r} key)")
        return p
    read_config(p, name)
    if not (p / "model.safetensors").is_file() or not (p / "specfuzz_table.json").is_file():
        raise InvalidInput(name, str(p), "a tablegen checkpoint folder (config.json, model.safetensors, specfuzz_table.json) "
                                         "or a table-model GGUF (a real model runs from its own GGUF: setting model_gguf)")
    return gguf_from_checkpoint(p, gguf_path(p))


class ServerDied(RuntimeError):
    """llama-server exited (or stopped answering) while specfuzz needed it."""


class LlamaCppEngine(Engine):
    """llama-server over HTTP (see the module docstring)."""

    name = ENGINE_NAME

    def __init__(self, **default_settings: Any) -> None:
        self._defaults = dict(default_settings)
        self._config: EngineConfig | None = None
        self._proc: subprocess.Popen | None = None
        self._port: int | None = None
        self._log: Path | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="specfuzz-llamacpp-"))
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._vocab = 0
        self._settings_used: dict[str, Any] = {}

    # -- description -----------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        from specfuzz.tablegen.vocab import MAX_VOCAB

        return Capabilities(
            methods=METHODS, sampling=SAMPLING, dtypes=("float32",), profile="llamacpp",
            max_vocab=MAX_VOCAB, draft_vocab="equal",
            spec_knobs={"verify": ("token",), "draft_sampling": ("greedy",), "draft_temperature": (None,), "ngram_min": (1,)},
            # A swap restarts llama-server on the new GGUF files (one model per server process).
            swap=frozenset({"target", "draft"}),
            speculates_first_token=False,
            spec_defaults=SPEC_DEFAULTS,
            # Both methods are verified by common_sampler_sample_and_accept_n with the request's chain.
            verify_samplers={"draft_model": "common_sampler_sample_and_accept_n", "ngram": "common_sampler_sample_and_accept_n"},
            verify_sampler_features=frozenset(SAMPLING - {"max_tokens", "ignore_eos"}),
        )

    def _server_binary(self, settings: Mapping[str, Any]) -> Path:
        from specfuzz.engines.llamacpp_build import LLAMA_CPP_PYTHON_VERSION, SERVER_ENV, ensure_server, find_server

        given = settings.get("server")
        if given:
            p = Path(given)
            if not (p.is_file() and os.access(p, os.X_OK)):
                raise InvalidInput("server", str(given), "an executable llama-server binary")
            return p
        version = settings.get("llama_cpp_python") or LLAMA_CPP_PYTHON_VERSION
        found = find_server(version)
        if found is not None:
            if not (found.is_file() and os.access(found, os.X_OK)):
                raise InvalidInput(SERVER_ENV, str(found), "an executable llama-server binary")
            return found
        if version != LLAMA_CPP_PYTHON_VERSION:
            return ensure_server(version)  # another release (bisect): built on first use
        raise InvalidInput("llama-server", None, "a built llama-server: run bin/setup, or "
                           "`python -m specfuzz.engines.llamacpp_build`, or set $SPECFUZZ_LLAMA_SERVER")

    def _help(self, binary: Path) -> str:
        """The build's ``--help`` text (cached per binary): which options it takes."""
        cache = self.__dict__.setdefault("_help_cache", {})
        if binary not in cache:
            try:
                got = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
                cache[binary] = got.stdout + got.stderr
            except (OSError, subprocess.SubprocessError):
                cache[binary] = ""
        return cache[binary]

    def version(self) -> Mapping[str, str]:
        from specfuzz.engines.llamacpp_build import LLAMA_CPP_PYTHON_VERSION

        settings = self._settings(self._config.settings if self._config else {})
        version = settings.get("llama_cpp_python") or LLAMA_CPP_PYTHON_VERSION
        # A wrapper class's own name (tests' SynthAcceptLlamaCpp): its entries replay through it.
        out = {"name": self.name, "version": version, "llama_cpp_python": version, "package": "llama-cpp-python",
               "device": f"cpu {_cpu_model()}", "machine": platform.machine(), "python": platform.python_version()}
        try:
            binary = self._server_binary(settings)
            built = binary.parent.parent / "build.json"  # a build by llamacpp_build says which release it came from
            if built.is_file():
                version = str(json.loads(built.read_text()).get("llama_cpp_python") or version)
                out.update(version=version, llama_cpp_python=version)
            got = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
            line = [ln for ln in (got.stdout + got.stderr).splitlines() if ln.startswith("version")]
            out["llama_cpp_build"] = line[0].split(":", 1)[1].strip() if line else "unknown"
            out["server"] = str(binary)
        except (InvalidInput, OSError, subprocess.SubprocessError) as exc:
            out["llama_cpp_build"] = f"unavailable ({exc})"
        return out

    # -- settings and start ------------------------------------------------------------

    def _settings(self, given_settings: Mapping[str, Any]) -> dict[str, Any]:
        out = merged_settings(SETTINGS, self._defaults, given_settings, passthrough=PASSTHROUGH_SETTINGS)
        for name, lo, hi in (("slots", 1, 64), ("threads", 1, 1024), ("draft_n_min", 0, 1 << 16)):
            v = out[name]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise InvalidInput(name, v, SETTINGS[name][1])
        port = out["port"]
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535):
            raise InvalidInput("port", port, SETTINGS["port"][1])
        if out["ngram_type"] not in NGRAM_TYPES:
            raise InvalidInput("ngram_type", out["ngram_type"], SETTINGS["ngram_type"][1])
        if out["cache_prompt"] not in (True, False):
            raise InvalidInput("cache_prompt", out["cache_prompt"], SETTINGS["cache_prompt"][1])
        pm = out["draft_p_min"]
        if isinstance(pm, bool) or not isinstance(pm, (int, float)) or not 0.0 <= float(pm) <= 1.0:
            raise InvalidInput("draft_p_min", pm, SETTINGS["draft_p_min"][1])
        extra = out["extra_args"]
        if isinstance(extra, str) or not isinstance(extra, (list, tuple)) or not all(isinstance(a, str) for a in extra):
            raise InvalidInput("extra_args", extra, SETTINGS["extra_args"][1])
        out["extra_args"] = tuple(extra)
        for name in ("start_timeout_s", "request_timeout_s"):
            v = out[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise InvalidInput(name, v, SETTINGS[name][1])
        return out

    def validate(self, config: EngineConfig) -> dict[str, Any]:
        """Everything start() checks before launching a server; returns the settings."""
        if config.dtype != "float32":
            raise InvalidInput("dtype", config.dtype, "'float32' (the GGUF tables are F32)")
        settings = self._settings(config.settings)
        spec = config.speculation
        if spec is None:
            return settings
        if not isinstance(spec, SpecConfig):
            raise InvalidInput("speculation", type(spec).__name__, "None or a SpecConfig")
        if spec.method not in METHODS:
            raise InvalidInput("speculation method", spec.method, f"one of {METHODS} (llama-server: -md, --spec-type ngram-*)")
        if spec.inject is not None:
            raise InvalidInput("inject", spec.inject, "None (bug injection is the reference engine's)")
        if spec.verify != "token":
            raise InvalidInput("verify", spec.verify, "'token' (llama-server keeps drafts while the target's samples equal them)")
        if spec.method == "draft_model":
            if config.draft_dir is None:
                raise InvalidInput("draft_dir", None, "a draft checkpoint for method 'draft_model'")
            if config.draft_d2t is not None and tuple(config.draft_d2t) != tuple(range(len(config.draft_d2t))):
                raise InvalidInput("draft_d2t", config.draft_d2t, "None or the identity (llama.cpp maps draft tokens by id)")
        elif spec.ngram_min != 1 and not spec.engine_default:
            raise InvalidInput("ngram_min", spec.ngram_min, "1 (llama.cpp's n-gram drafters match one length, ngram_max)")
        return settings

    def _real_model(self, config: EngineConfig, settings: Mapping[str, Any]) -> tuple[Path, Path | None, int]:
        """(target GGUF, draft GGUF, vocabulary) of a real model (setting model_gguf)."""
        from specfuzz.tablegen.gguf_model import read_gguf_info

        g = Path(settings["model_gguf"])
        info = read_gguf_info(g)
        if info["table_model"]:
            raise InvalidInput("model_gguf", str(g), "a real model's GGUF (this one is a table model: pass it as target_dir)")
        draft = None
        if config.speculation is not None and config.speculation.method == "draft_model":
            if config.draft_dir is None or Path(config.draft_dir).resolve() != Path(config.target_dir).resolve():
                raise InvalidInput("draft_dir", str(config.draft_dir), "the target itself (llama.cpp runs GGUF files; a "
                                   "real draft model needs its own GGUF)")
            draft = g
        return g, draft, int(info["vocab_size"])

    def start(self, config: EngineConfig) -> None:
        settings = self.validate(config)
        binary = self._server_binary(settings)
        real = settings["model_gguf"] is not None
        if real:
            target, draft, V = self._real_model(config, settings)
        else:
            from specfuzz.tablegen.gguf_model import read_gguf_info

            target = model_gguf(Path(config.target_dir), "target_dir")
            draft = None
            if config.speculation is not None and config.speculation.method == "draft_model":
                draft = model_gguf(Path(config.draft_dir), "draft_dir")
            V = int(read_gguf_info(target)["vocab_size"])
            if draft is not None and read_gguf_info(draft)["vocab_size"] != V:
                raise InvalidInput("draft vocab_size", read_gguf_info(draft)["vocab_size"], f"{V} (the target's)")
        self.close()
        self._launch(binary, for_server(server_args(config, target, draft, settings), self._help(binary)), settings)
        self._config, self._vocab, self._settings_used = config, V, settings
        if real:
            return  # no table to check: a real model (specfuzz compare)
        check = self.check_tables()
        if not check.ok:
            self.close()
            raise RuntimeError(f"llama-server does not reproduce the target table: {check.detail}")

    def _launch(self, binary: Path, args: list[str], settings: Mapping[str, Any]) -> None:
        port = settings["port"]
        if port is not None and _port_taken(int(port)):
            raise InvalidInput("port", port, "a free TCP port (another process listens on it; leave port unset to pick one)")
        for attempt in range(3):
            p = int(port) if port is not None else _free_port()
            self._log = self._tmp / "server.log"
            with open(self._log, "wb") as log:
                self._proc = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(p), *args],
                                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True)
            self._port = p
            try:
                self._wait_ready(float(settings["start_timeout_s"]))
                break
            except ServerDied as exc:
                taken = "bind" in self._log_tail().lower() and port is None and attempt < 2
                self._stop()
                if not taken:
                    raise RuntimeError(str(exc)) from None
        self._pool = ThreadPoolExecutor(max_workers=int(settings["slots"]), thread_name_prefix="llamacpp-http")

    def _log_tail(self, n: int = 3000) -> str:
        try:
            return self._log.read_text(errors="replace")[-n:] if self._log else ""
        except OSError:
            return ""

    def _wait_ready(self, timeout: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self._proc.poll() is not None:
                raise ServerDied(f"llama-server exited with status {self._proc.returncode} while starting:\n{self._log_tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=2)
                conn.request("GET", "/health")
                r = conn.getresponse()
                r.read()
                conn.close()
                if r.status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise ServerDied(f"llama-server did not answer /health within {timeout:g} s:\n{self._log_tail()}")

    # -- HTTP ----------------------------------------------------------------------------

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "port", None) != self._port:
            conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=float(self._settings_used.get("request_timeout_s", 300)))
            self._local.conn, self._local.port = conn, self._port
        data = json.dumps(body).encode()
        for attempt in range(2):
            try:
                conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                text = r.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if self._proc is None or self._proc.poll() is not None:
                    code = None if self._proc is None else self._proc.returncode
                    raise ServerDied(f"llama-server exited with status {code} during a request ({type(exc).__name__}: {exc}):\n"
                                     f"{self._log_tail()}") from None
                if attempt:
                    raise ServerDied(f"llama-server stopped answering ({type(exc).__name__}: {exc})") from None
        if r.status != 200:
            raise RuntimeError(f"llama-server answered {path} with HTTP {r.status}: {text[:500]!r}")
        return json.loads(text)

    # -- tables --------------------------------------------------------------------------

    def check_tables(self) -> TableCheck:
        """Every row's raw probabilities (``n_probs``, before the sampler chain) from the
        running server, against the softmax of the target table (and the pad token's 0)."""
        from specfuzz.tablegen.gguf_model import checkpoint_table

        cfg = self._config
        tdir = Path(cfg.target_dir)
        if tdir.is_file():
            from specfuzz.tablegen.gguf_model import read_gguf_table

            table = read_gguf_table(tdir)
        else:
            table = checkpoint_table(tdir)  # [V, V] float32
        V = table.shape[0]
        want = table.astype(np.float64)
        want = want - want.max(axis=1, keepdims=True)
        want = want - np.log(np.exp(want).sum(axis=1, keepdims=True))  # [V, V] log-softmax
        bodies = [{"prompt": [r], "n_predict": 1, "n_probs": V + 1, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                   "min_p": 0.0, "return_tokens": True, "post_sampling_probs": False, "seed": r} for r in range(V)]
        outs = list(self._pool.map(lambda b: self._post("/completion", b), bodies))
        worst, bad = 0.0, []
        for r, out in enumerate(outs):
            top = out["completion_probabilities"][0]["top_logprobs"]
            got = np.full(V + 1, -np.inf)
            for e in top:
                lp = float(e["logprob"])
                got[int(e["id"])] = -np.inf if lp < -1e30 else lp
            if np.isfinite(got[V]):
                bad.append(f"row {r}: the pad token has probability {np.exp(got[V])!r}")
            row = got[:V]
            under = want[r] < UNDERFLOW_LOGPROB
            ok_under = ~np.isfinite(row) | (row < UNDERFLOW_LOGPROB)
            diff = np.where(under, 0.0, np.abs(row - want[r]))
            diff = np.where(np.isfinite(diff), diff, np.inf)
            worst = max(worst, float(diff.max()))
            if diff.max() > CHECK_ATOL or not ok_under[under].all():
                c = int(np.argmax(diff))
                bad.append(f"row {r}: token {c} log-probability {row[c]!r}, table {want[r, c]!r}")
        return TableCheck(ok=not bad, rows=V, max_abs_diff=worst, tolerance=CHECK_ATOL,
                          detail="llama-server n_probs (raw log-probabilities) of every row" + ("; " + "; ".join(bad[:3]) if bad else ""))

    def swap(self, config: EngineConfig) -> SwapReport:
        """Restart llama-server on ``config``'s GGUF files (one model per server process)."""
        from specfuzz.engines.base import swap_parts

        t0 = time.perf_counter()
        parts = swap_parts(self._config, config) if self._config is not None else ("target",)
        self.start(config)
        return SwapReport(seconds=time.perf_counter() - t0, parts=tuple(parts), reset=RESTART_RESETS)

    def reset_state(self) -> tuple[str, ...]:
        """Restart llama-server on the same files: its prompt cache, slots and n-gram drafters'
        state (kept across requests) start empty, as after a start or swap (~0.1 s)."""
        if self._config is None:
            return ()
        self.start(self._config)
        return RESTART_RESETS

    # -- generation ----------------------------------------------------------------------

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if self._proc is None or self._config is None:
            raise RuntimeError("generate() before start()")
        bodies = [completion_body(r, self._vocab) for r in requests]
        if not self._settings_used["cache_prompt"]:
            for b in bodies:
                b["cache_prompt"] = False
        outs = list(self._pool.map(lambda b: self._post("/completion", b), bodies))
        res = []
        for out in outs:
            tokens = tuple(int(t) for t in out.get("tokens", ()))
            stop = out.get("stop_type", "none")
            t = out.get("timings") or {}
            res.append(Completion(tokens, {"eos": "stop", "limit": "length"}.get(stop, stop),
                                  num_draft_tokens=t.get("draft_n"), num_accepted_tokens=t.get("draft_n_accepted")))
        return res

    # -- lifecycle -----------------------------------------------------------------------

    def _stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=10)
            self._proc = None
        self._local = threading.local()

    def close(self) -> None:
        self._stop()
        self._config = None

    def __del__(self) -> None:
        try:
            self._stop()
            shutil.rmtree(self._tmp, ignore_errors=True)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
