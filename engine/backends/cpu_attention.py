"""Decode-step attention on the CPU from a small C kernel (cpu_attention.c), compiled on this machine.

Past a few hundred cached positions, attention is what grows in a CPU decode step: on the default
135M model at 3,000 positions it reads 138 MB of float32 keys and values per token, a quarter of the
weights' bytes. torch's CPU attention reads them at 6-8 GB/s on a 2-core AMD EPYC (its matrix
products of 3 query rows pack their operands first), a plain read at 15-21; the kernel reads them
at 11-13 (bench/cpu_attention.py: 409 against torch's 626 us a layer at 3,000 positions).

The kernel is built once per machine with the system's C compiler (`$CC`, else cc, gcc or clang)
into the cache dir, in a background thread started by the first model that could use it, so no
load waits for it. It is used only after it matched torch's attention on random caches, and only
when it runs on as many threads as torch does: built with OpenMP, and that OpenMP is the runtime
torch's kernels run on (one pool of threads, not two competing for the same cores). Without a
compiler, or when anything fails, the log says why and torch's attention stays, as before.
`LOGITLAB_CPU_ATTENTION=0` turns the kernel off.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.backends.torch_compile import relative_logit_error
from engine.loading.cache_dir import cache_root

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_attention.c")
ENV_SWITCH = "LOGITLAB_CPU_ATTENTION"
BUILD_TIMEOUT_S = 120
# Tried in order: -march=native lets the compiler use this CPU's vector width; OpenMP spreads the heads'
# positions over threads. Compilers that lack one (clang without libomp, some arm64 compilers) get the next.
FLAG_SETS = (
    ("-O3", "-march=native", "-fopenmp"),
    ("-O3", "-fopenmp"),
    ("-O3", "-march=native", "-fopenmp-simd"),
    ("-O3", "-fopenmp-simd"),
)
COMMON_FLAGS = ("-shared", "-fPIC", "-fno-math-errno")
MAX_GROUP, MAX_DIM = 16, 256  # as in cpu_attention.c
# Each head's positions are cut into pieces of at least MIN_PIECE positions, about PIECES_PER_THREAD per
# thread, as many on every thread (3 KV heads on 2 threads: 12 pieces; a prototype of this kernel at 3,000
# positions took 343 us a layer so, against 372 with 6 pieces and 464 with 3).
MIN_PIECE = 128
PIECES_PER_THREAD = 4
# The kernel agrees with torch when their outputs differ by less than this, relative to the largest output (or 1).
AGREEMENT = 1e-5


def _compiler() -> list[str] | None:
    env = os.environ.get("CC", "").strip()
    if env:
        return shlex.split(env)
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return [path]
    return None


def _machine_tag() -> str:
    """What a -march=native build depends on: a cache dir shared between machines must not mix them."""
    tag = platform.machine() + platform.system()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            tag += next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        tag += platform.processor()
    return tag


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


def openmp_runtime(library: ctypes.CDLL) -> str | None:
    """The file of the OpenMP runtime `library` calls (where its GOMP_parallel resolves), or None if unknown."""
    try:
        address = ctypes.cast(library.GOMP_parallel, ctypes.c_void_p).value
        dladdr = ctypes.CDLL(None).dladdr
    except (AttributeError, OSError):
        return None
    info = _DlInfo()
    if not dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.fname:
        return None
    return os.path.realpath(os.fsdecode(info.fname))


def torch_openmp_runtime() -> str | None:
    """The OpenMP runtime torch's CPU kernels run on (loaded with torch, so opening it again is free)."""
    for path in sorted((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*")):
        try:
            return openmp_runtime(ctypes.CDLL(str(path)))
        except OSError:
            continue
    return None


def build(cache: Path | None = None) -> Path | None:
    """The compiled kernel: from the cache when this source was built on this machine before, else
    compiled now (~0.5 s). None, with the reason logged, when there is no compiler or no flag set works;
    a flag set the compiler refused is not tried again (its `.failed` file in the cache says why; delete
    the file to retry)."""
    compiler = _compiler()
    if compiler is None:
        log.info("CPU attention kernel not built: no C compiler (set CC, or install cc); torch's attention is used")
        return None
    errors = []
    try:
        source = SOURCE.read_bytes()
        folder = (cache or cache_root()) / "kernels"
        folder.mkdir(parents=True, exist_ok=True)
        for flags in FLAG_SETS:
            command = [*compiler, *flags, *COMMON_FLAGS]
            key = hashlib.sha256(source + repr(command).encode() + _machine_tag().encode()).hexdigest()[:16]
            target = folder / f"cpu_attention-{key}.so"
            failed = target.with_suffix(".failed")
            if target.exists():
                return target
            if failed.exists():
                errors.append(f"{' '.join(flags)}: {failed.read_text(errors='replace').strip()}")
                continue
            error, lasting = _compile(command, target)
            if error is None:
                return target
            errors.append(f"{' '.join(flags)}: {error}")
            if lasting:
                failed.write_text(error + "\n")
    except OSError as error:
        errors.append(str(error))
    log.info("CPU attention kernel not built with %s: %s; torch's attention is used", compiler[0], "; ".join(errors))
    return None


def _compile(command: list[str], target: Path) -> tuple[str | None, bool]:
    """Compile SOURCE with `command` into `target`: (None, False), or what went wrong and whether it will go
    wrong again (the compiler refused; not a compiler that could not be started or ran out of time)."""
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        try:
            done = subprocess.run([*command, str(SOURCE), "-o", str(built), "-lm"], capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            return str(error), False
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            return (lines[-1] if lines else f"exit status {done.returncode}"), True
        os.replace(built, target)  # atomic: two processes building at once both end with a whole file
    return None, False


class DecodeAttention:
    """The loaded kernel. `__call__(q, keys, values, scale)`: q (1, KV, G, D) against keys/values
    (1, KV, N, D), float32 on the CPU, views of a cache buffer as `takes_cache` accepts it; returns
    (1, KV, G, D), as torch's `scaled_dot_product_attention` returns for the same arguments."""

    def __init__(self, path: Path):
        lib = self.library = ctypes.CDLL(str(path))
        c = ctypes
        self._run = lib.decode_attention
        self._run.argtypes = [c.c_void_p] * 5 + [c.c_int] * 3 + [c.c_long] * 3 + [c.c_float, c.c_int, c.c_int]
        self._run.restype = c.c_int
        self._scratch_floats = lib.decode_attention_scratch
        self._scratch_floats.argtypes = [c.c_int] * 3 + [c.c_long, c.c_int]
        self._scratch_floats.restype = c.c_long
        lib.decode_attention_threaded.restype = c.c_int
        self.threaded = bool(lib.decode_attention_threaded())
        self.path = path
        self._local = threading.local()  # a scratch buffer per thread: two models may decode at once

    @staticmethod
    def takes_cache(keys: torch.Tensor, values: torch.Tensor, kv_heads: int, group: int, dim: int) -> bool:
        """Whether the kernel reads a cache whose key and value buffers are these, for these sizes."""
        return (
            all(t.dtype == torch.float32 and t.device.type == "cpu" for t in (keys, values))
            and keys.dim() == 4 and keys.shape[0] == 1 and keys.shape[1] == kv_heads and keys.shape[3] == dim
            and keys.shape == values.shape and keys.stride() == values.stride() and keys.stride(3) == 1
            and 1 <= group <= MAX_GROUP and 1 <= dim <= MAX_DIM
        )

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                 pieces: int | None = None) -> torch.Tensor:
        """`pieces`: how many pieces each head's positions are cut into (tests); by default about
        PIECES_PER_THREAD per thread over all heads, none shorter than MIN_PIECE positions."""
        _, kv_heads, group, dim = q.shape
        n = keys.shape[2]
        q = q.contiguous()
        threads = torch.get_num_threads() if self.threaded else 1
        if pieces is None:
            pieces = _pieces(kv_heads, threads, n)
        needed = self._scratch_floats(kv_heads, group, dim, n, pieces)
        scratch = getattr(self._local, "scratch", None)
        if scratch is None or scratch.numel() < needed:  # grown by half again: a growing context reallocates rarely
            scratch = self._local.scratch = torch.empty(needed + needed // 2)
        out = torch.empty_like(q)
        status = self._run(q.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(), scratch.data_ptr(),
                           kv_heads, group, dim, n, keys.stride(1), keys.stride(2), scale, pieces, threads)
        if status != 0:
            raise ValueError(f"the CPU attention kernel does not take group {group}, head size {dim}, {n} positions")
        return out


def _pieces(kv_heads: int, threads: int, n: int) -> int:
    """How many pieces to cut each head's n positions into (see PIECES_PER_THREAD)."""
    target = -(-PIECES_PER_THREAD * threads // kv_heads)
    even = next((p for p in range(target, 2 * target + 1) if kv_heads * p % threads == 0), target)
    return max(1, min(even, n // MIN_PIECE))


def agrees_with_torch(kernel: DecodeAttention, seed: int = 0) -> str | None:
    """None when the kernel matches torch's attention on random caches (several shapes and lengths, views
    of larger buffers as a cache holds them), else what differed."""
    generator = torch.Generator().manual_seed(seed)
    for kv_heads, group, dim, n in ((3, 3, 64, 1), (3, 3, 64, 700), (2, 4, 128, 333), (1, 1, 80, 1500)):
        buffer = torch.randn(2, 1, kv_heads, n + 37, dim, generator=generator)
        keys, values = buffer[0, :, :, :n], buffer[1, :, :, :n]
        q = torch.randn(1, kv_heads, group, dim, generator=generator)
        theirs = F.scaled_dot_product_attention(q, keys, values, scale=dim**-0.5)
        ours = kernel(q, keys, values, dim**-0.5)
        error = relative_logit_error(ours, theirs)
        if not error <= AGREEMENT:
            return f"{error:.3g} from torch's at {kv_heads} heads x {group} queries, head size {dim}, {n} positions"
    return None


def load(cache: Path | None = None, check: bool = True) -> DecodeAttention | None:
    """Build (or find) and load the kernel, and (`check`) compare it with torch's attention; None, with the
    reason logged, if any step fails or the kernel would not run on torch's threads."""
    if os.environ.get(ENV_SWITCH, "").strip() == "0":
        log.info("CPU attention kernel off (%s=0)", ENV_SWITCH)
        return None
    path = build(cache)
    if path is None:
        return None
    try:
        kernel = DecodeAttention(path)
    except (OSError, AttributeError) as error:
        log.info("CPU attention kernel %s does not load: %s", path, error)
        return None
    if kernel.threaded:
        ours, torchs = openmp_runtime(kernel.library), torch_openmp_runtime()
        if ours is None or ours != torchs:
            # Two thread pools on the same cores would each wait for the other's spinning threads
            log.info("CPU attention kernel not used: its OpenMP runtime (%s) is not torch's (%s)", ours, torchs)
            return None
    elif torch.get_num_threads() > 1:
        log.info("CPU attention kernel built without OpenMP: it would run on one thread, torch's on %d; not used",
                 torch.get_num_threads())
        return None
    return kernel if not check or checked(kernel) else None


def checked(kernel: DecodeAttention) -> bool:
    """Whether the kernel agrees with torch's attention (agrees_with_torch), logged either way."""
    problem = agrees_with_torch(kernel)
    if problem:
        log.warning("CPU attention kernel not used: it differs by %s", problem)
        return False
    log.info("CPU attention kernel ready (%s)", kernel.path.name)
    return True


class _Shared:
    """One kernel per process. A daemon thread builds and loads it (a compiler subprocess: no torch work
    beside the decode thread's); the first `get()` after that checks it against torch's attention on
    the calling thread, a few ms, and from then on returns it, or None when it is not there or failed."""

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loaded: DecodeAttention | None = None
        self._kernel: DecodeAttention | None = None
        self._checked = False

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._build, name="cpu-attention-build", daemon=True)
                self._thread.start()

    def _build(self) -> None:
        try:
            self._loaded = load(check=False)
        except Exception:  # a build thread must never take the process down; torch's attention stays
            log.exception("building the CPU attention kernel failed")

    def get(self) -> DecodeAttention | None:
        if self._checked or self._loaded is None:
            return self._kernel
        with self._lock:
            if not self._checked:
                self._kernel = self._loaded if checked(self._loaded) else None
                self._checked = True
        return self._kernel

    def wait(self, timeout: float | None = None) -> DecodeAttention | None:
        """The kernel after the build finished (tests and benchmarks; the decode step never waits)."""
        self.start()
        self._thread.join(timeout)
        return self.get()


shared = _Shared()
