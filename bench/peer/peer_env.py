"""The process environment of the PyTorch peer: which BLAS torch gets, OpenBLAS's kernel choice,
its thread count, and glibc malloc's settings, decided before torch is imported (these libraries
read their settings when they are loaded), by re-executing the script once with them set. No
system setting is changed.

Why (measured on the 2-vCPU Emerald Rapids VM, docs in bench/peer/README.md):
- Debian's python3-torch links the generic libblas.so.3. The reference BLAS (libblas3) is
  10-50x slower than OpenBLAS for f32 products (2.9 GFLOP/s against 30-140 here); when
  update-alternatives selects it for libblas.so.3-x86_64-linux-gnu, the peer LD_PRELOADs
  OpenBLAS's libblas.so.3 instead.
- OpenBLAS 0.3.21 (Debian 12) does not know this CPU model and falls back to its generic
  'Prescott' kernels (4.7x slower: 30 against 140 GFLOP/s); the peer sets OPENBLAS_CORETYPE from the CPU's flags.
- OpenBLAS's pthread build starts one thread per CPU whatever torch.set_num_threads says;
  OPENBLAS_NUM_THREADS follows --threads, and OpenMP's idle threads sleep (OMP_WAIT_POLICY=
  PASSIVE) instead of spinning against OpenBLAS's threads: 1.3x on f32 steps with 2 cores.
  (OpenBLAS's OpenMP build, libopenblas0-openmp, one pool for both, measured the same.)
- glibc malloc keeps freed memory (see plan): 1.3x on f32 steps, 1.15x on bf16.
"""
import ctypes
import os
import subprocess
import sys

LIBDIR = "/usr/lib/x86_64-linux-gnu"
SYSTEM_BLAS = os.path.join(LIBDIR, "libblas.so.3")
OPENBLAS_BLAS = os.path.join(LIBDIR, "openblas-pthread", "libblas.so.3")
REFERENCE_BLAS_DIR = os.path.join(LIBDIR, "blas")
_MARK = "S3R_PEER_ENV_SET"


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def isa_tiers(flags=None):
    """The CPU's vector tiers that matter here, e.g. 'avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16'."""
    flags = cpu_flags() if flags is None else flags
    names = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"]
    return " ".join(n for n in names if n in flags) or "no AVX2"


def native_bf16(flags=None):
    """bf16 products in hardware: AVX-512 BF16 or AMX-BF16 (else autocast would be emulation)."""
    flags = cpu_flags() if flags is None else flags
    return "avx512_bf16" in flags or "amx_bf16" in flags


def openblas_core_for(flags):
    """The OpenBLAS 0.3.21 kernel set for these flags (COOPERLAKE = SKYLAKEX + AVX-512 BF16)."""
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "COOPERLAKE" if "avx512_bf16" in flags else "SKYLAKEX"
    if {"avx2", "fma"} <= flags:
        return "HASWELL"
    return None


def system_blas_target():
    return os.path.realpath(SYSTEM_BLAS) if os.path.exists(SYSTEM_BLAS) else None


def _probe_openblas_core(lib):
    """OpenBLAS's own choice of kernels for this CPU (openblas_get_corename), in a child process
    so that this one loads nothing yet."""
    code = ("import ctypes,sys; l=ctypes.CDLL(sys.argv[1]); f=l.openblas_get_corename; "
            "f.restype=ctypes.c_char_p; print(f().decode())")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    try:
        out = subprocess.run([sys.executable, "-c", code, lib], capture_output=True, text=True, env=env, timeout=60)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# OpenBLAS kernel sets that use the wide vector units this code cares about.
_GOOD_CORES = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"}


def plan(threads, malloc_tuning=True):
    """The environment variables the peer needs, and notes saying why, before torch loads."""
    env, notes = {}, []
    target = system_blas_target()
    lib = target
    if target and os.path.dirname(target).rstrip("/").endswith("/blas") and os.path.exists(OPENBLAS_BLAS):
        # The reference BLAS is selected system-wide: give this process OpenBLAS instead.
        preload = os.environ.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = (OPENBLAS_BLAS + " " + preload).strip()
        lib = OPENBLAS_BLAS
        notes.append(f"libblas.so.3 -> reference BLAS ({target}); LD_PRELOAD {OPENBLAS_BLAS} for this process")
    elif target and "blas" in os.path.dirname(target) and "openblas" not in target:
        notes.append(f"WARNING: libblas.so.3 -> {target} and no OpenBLAS at {OPENBLAS_BLAS}: "
                     "f32 products will be slow (apt-get install libopenblas0-pthread)")
    if lib and "openblas" in lib:
        if "OPENBLAS_CORETYPE" in os.environ:
            notes.append(f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} (given)")
        else:
            detected = _probe_openblas_core(lib)
            want = openblas_core_for(cpu_flags())
            if want and (detected or "").lower() not in _GOOD_CORES:
                env["OPENBLAS_CORETYPE"] = want
                notes.append(f"OpenBLAS detects core '{detected}' on this CPU; OPENBLAS_CORETYPE={want} from its flags")
        if threads and "OPENBLAS_NUM_THREADS" not in os.environ:
            env["OPENBLAS_NUM_THREADS"] = str(threads)
        if "openblas-pthread" in lib and "OMP_WAIT_POLICY" not in os.environ:
            # Two thread pools (OpenBLAS's pthreads for the f32 products, torch's OpenMP for the
            # rest) spin after their work and take the cores from each other: OpenMP threads
            # that sleep when idle made f32 steps of `small` 1.3x faster on 2 cores (bf16: same).
            env["OMP_WAIT_POLICY"] = "PASSIVE"
            notes.append("OMP_WAIT_POLICY=PASSIVE (OpenBLAS's pthread pool beside torch's OpenMP pool)")
    if threads and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    if malloc_tuning:
        # Keep freed memory in the heap: glibc otherwise maps each large tensor afresh and the
        # kernel zero-fills its pages on every step (ARCHITECTURE.md, Memory).
        for k, v in (("MALLOC_MMAP_MAX_", "0"), ("MALLOC_TRIM_THRESHOLD_", str(1 << 40)),
                     ("MALLOC_TOP_PAD_", str(64 << 20))):
            if k not in os.environ:
                env[k] = v
    return env, notes


def ensure(threads, malloc_tuning=True):
    """Re-executes this script once with the planned environment; returns the notes (carried
    through the environment to the re-executed process)."""
    if os.environ.get(_MARK) is not None:
        return [n for n in os.environ.get(_MARK, "").split("\n") if n]
    env, notes = plan(threads, malloc_tuning)
    new_env = dict(os.environ)
    new_env.update(env)
    new_env[_MARK] = "\n".join(notes)
    os.execve(sys.executable, [sys.executable] + sys.argv, new_env)


def loaded_blas():
    """Paths of the BLAS / oneDNN / OpenMP libraries mapped into this process."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6:
                p = parts[-1]
                base = os.path.basename(p)
                if any(k in base for k in ("blas", "dnnl", "mkl", "gomp", "iomp", "lapack")):
                    libs.add(p)
    return sorted(libs)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def sgemm_provider():
    """The file whose sgemm_ torch's f32 products call: dlsym through libtorch_cpu's handle (the
    symbol it binds to, LD_PRELOAD included), then dladdr; None if that cannot be found."""
    try:
        torch_cpu = next(p for p in loaded_blas_and_torch() if os.path.basename(p).startswith("libtorch_cpu"))
        addr = ctypes.cast(ctypes.CDLL(torch_cpu).sgemm_, ctypes.c_void_p).value
        info = _DlInfo()
        if ctypes.CDLL("libc.so.6").dladdr(ctypes.c_void_p(addr), ctypes.byref(info)) == 0:
            return None
        return os.path.realpath(info.dli_fname.decode())
    except (StopIteration, OSError, AttributeError):
        return None


def loaded_blas_and_torch():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if len(line.split()) >= 6})


def blas_summary():
    """(one line: the library that serves torch's f32 products, OpenBLAS's kernels and threads;
    the BLAS-like libraries mapped into this process)."""
    import torch

    a = torch.ones(64, 64)
    _ = a @ a  # loads the BLAS if it is loaded lazily
    libs = loaded_blas()
    provider = sgemm_provider()
    if provider is None:
        return "unknown (sgemm_ not found)", libs
    if "openblas" in provider:
        kind = f"OpenBLAS ({provider})"
        try:
            lib = ctypes.CDLL(provider)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            lib.openblas_get_config.restype = ctypes.c_char_p
            config = lib.openblas_get_config().decode().split()
            version = config[1] if len(config) > 1 else "?"
            kind = f"OpenBLAS {version} ({os.path.basename(os.path.dirname(provider))}), core " \
                   f"{lib.openblas_get_corename().decode()}, {lib.openblas_get_num_threads()} threads"
        except (OSError, AttributeError):
            pass
    elif os.path.dirname(provider).endswith("/blas"):
        kind = f"REFERENCE BLAS {provider} (10-50x slower than OpenBLAS for f32 products: install libopenblas0-pthread)"
    else:
        kind = provider
    return kind, libs


def onednn_isa():
    """oneDNN's ISA line for a bf16 product (its verbose output), e.g. 'Intel AVX-512 ... AMX'."""
    import tempfile

    import torch

    out = ""
    with tempfile.TemporaryFile(mode="w+") as tmp:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(tmp.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                a = torch.ones(32, 32, dtype=torch.bfloat16)
                _ = a @ a
        except Exception:  # noqa: BLE001 - verbose mode is optional information
            pass
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        out = tmp.read()
    isa, impl = "", ""
    for line in out.splitlines():
        if ",isa:" in line:
            isa = line.split(",isa:", 1)[1].strip()
        if line.startswith(("onednn_verbose,exec", "dnnl_verbose,exec")):
            fields = line.split(",")
            if len(fields) > 4:
                impl = fields[4]  # e.g. brg:avx512_core_amx_bf16
    return isa, impl
