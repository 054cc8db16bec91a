"""Stages that build what the others run: libfabric with CUDA, nccl-tests, other NCCL versions,
fabtests."""
import os
import shutil
import threading
from glob import glob

from gpurun.config import (
    LF,
    LIBFABRIC_TARBALL,
    NCCL_SRC_DIR,
    NCCL_TESTS_DIR,
    NCCL_TESTS_MPI_DIR,
    NCCL_TESTS_SRC,
    OUT,
    WORK,
    env_or,
    now,
)
from gpurun.runner import (
    Failed,
    executable,
    execute,
    export,
    failed_build,
    finish,
    lines,
    log,
    logf,
    mkdirs,
    need,
    probe,
    remove,
    start,
)
from gpurun.nccl import mpi_build_of


def build_libfabric(prefix, extra, name):
    """libfabric 2.1 into PREFIX with the configure flags EXTRA (scripts/build-libfabric.sh)."""
    env = [f"LIBFABRIC_PREFIX={prefix}", f"LIBFABRIC_TARBALL={LIBFABRIC_TARBALL}", f"LIBFABRIC_CONFIGURE_EXTRA={extra}"]
    failed_build(execute(["bash", "scripts/build-libfabric.sh"], env, out=logf(name)), logf(name), 40)


def mpi_home():
    """Where mpi.h lives, as nccl-tests' MPI_HOME (its include/ and lib/); empty if none."""
    if now.dry:
        return "<mpi-home>"
    for d in [*probe(["mpicc", "--showme:incdirs"], "").split(), "/usr/lib/x86_64-linux-gnu/openmpi/include"]:
        if os.path.isfile(f"{d}/mpi.h") and os.path.isdir(f"{d}/../lib"):
            return os.path.abspath(f"{d}/..")
    return ""


def gencode():
    cap = probe(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], "<cap>")
    cap = cap.split("\n")[0].replace(".", "").replace(" ", "")
    return f"NVCC_GENCODE=-gencode=arch=compute_{cap},code=sm_{cap}"


def tool_setup(tool, tarball):
    """TOOL from TARBALL (bin/ and lib/, made by scripts/gpu/prepare.sh) where the machine has none."""
    if shutil.which(tool) or not os.path.isfile(tarball):
        return
    d = f"{WORK}/{tool}"
    if not executable(f"{d}/bin/{tool}"):
        mkdirs(d)
        execute(["tar", "-C", d, "--strip-components=1", "-xJf", tarball])
    if not now.dry:
        with open(f"{d}/{tool}", "w") as f:
            f.write(f'#!/bin/sh\nLD_LIBRARY_PATH={d}/lib exec {d}/bin/{tool} "$@"\n')
        os.chmod(f"{d}/{tool}", 0o755)
    export("PATH", f"{d}:{os.environ.get('PATH', '')}")
    if not now.dry and execute([tool, "-V"], out=os.devnull) and execute([tool, "--version"], out=os.devnull):
        log(f"{tool} from {tarball} does not run here")


def stage_libfabric():
    """build libfabric 2.1 with --with-cuda --enable-cuda-dlopen (cached)"""
    if os.path.exists(f"{LF}/lib/libfabric.so"):
        log("libfabric with CUDA: cached")
        return
    log("building libfabric 2.1 with CUDA")
    build_libfabric(LF, "--with-cuda=/usr/local/cuda --enable-cuda-dlopen", "libfabric-build")


def stage_nccltests():
    """build nccl-tests from $NCCL_TESTS_SRC against the NCCL PyTorch loads, with MPI=0 and (where
    mpicc is found) MPI=1 (cached)"""
    need(os.path.isfile(f"{NCCL_TESTS_SRC}/src/Makefile"), f"no nccl-tests source in {NCCL_TESTS_SRC}")
    need(now.nccl_dir, "no NCCL found (python3 -c 'import nvidia.nccl')")
    home = f"{WORK}/nccl-home"
    mkdirs(f"{home}/lib")
    execute(["ln", "-sf", f"{now.nccl_dir}/lib/libnccl.so.2", f"{home}/lib/libnccl.so"])
    execute(["ln", "-sfn", f"{now.nccl_dir}/include", f"{home}/include"])
    make = ["make", "-C", f"{NCCL_TESTS_SRC}/src", "-j16", "CUDA_HOME=/usr/local/cuda", f"NCCL_HOME={home}", gencode()]
    builds = []
    if not executable(f"{NCCL_TESTS_DIR}/all_reduce_perf"):
        builds.append(start([*make, "MPI=0", f"BUILDDIR={NCCL_TESTS_DIR}"], out=logf("nccl-tests-build")))
    mpi = mpi_home()
    if mpi and not executable(f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf"):
        builds.append(start([*make, "MPI=1", f"MPI_HOME={mpi}", f"BUILDDIR={NCCL_TESTS_MPI_DIR}"],
                            out=logf("nccl-tests-mpi-build")))
    for build in builds:
        finish(build)
    if not now.dry:
        failed_build(not executable(f"{NCCL_TESTS_DIR}/all_reduce_perf"), logf("nccl-tests-build"), 20)
        if not executable(f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf"):
            log(f"no MPI build of nccl-tests (mpi.h: {mpi or 'not found'})")


def stage_pack():
    """the libfabric and nccl-tests builds as $OUT/builds.tar.xz, to unpack into .scratch/gpu-work
    on the next machine (the libfabric and nccltests stages then find them built)"""
    tests = [f"{d}/{t}_perf" for d in ("nccl-tests", "nccl-tests-mpi") for t in ("all_reduce", "sendrecv", "alltoall")]
    execute(["tar", "-cJf", f"{OUT}/builds.tar.xz", "-C", WORK, "libfabric-cuda/lib", "libfabric-cuda/bin",
             "libfabric-cuda/include", *tests], out=os.devnull)
    log(f"packed {(probe(['du', '-h', f'{OUT}/builds.tar.xz'], '<size>').split() or [''])[0]}")


def nccl_tags():
    """The NCCL tags in $NCCL_TAGS, else those of the tarballs in $NCCL_SRC_DIR."""
    if env_or("NCCL_TAGS"):
        return env_or("NCCL_TAGS").split()
    return [os.path.basename(f)[len("nccl-"):-len(".tar.xz")] for f in sorted(glob(f"{NCCL_SRC_DIR}/nccl-*.tar.xz"))]


def build_nccl(tag, gencode_):
    """NCCL TAG from its source tarball, and nccl-tests (and its MPI build for two hosts) against it."""
    src, tests = f"{WORK}/nccl-{tag}", f"{WORK}/nccl-tests-{tag}"
    build = f"{src}/build"
    if not os.path.exists(f"{build}/lib/libnccl.so"):
        remove(src)
        mkdirs(WORK)
        execute(["tar", "-xJf", f"{NCCL_SRC_DIR}/nccl-{tag}.tar.xz", "-C", WORK])
        make = ["make", "-C", src, "-j16", "src.build", "CUDA_HOME=/usr/local/cuda", f"BUILDDIR={build}", gencode_]
        if execute(make, out=logf(f"nccl-{tag}-build")):
            last = "".join(f"{line} " for line in lines(logf(f"nccl-{tag}-build"))[-3:])
            log(f"NCCL {tag} does not build here: {last[:300]}")
            return
    make = ["make", "-C", f"{NCCL_TESTS_SRC}/src", "-j8", "CUDA_HOME=/usr/local/cuda", f"NCCL_HOME={build}"]
    if not executable(f"{tests}/all_reduce_perf"):
        if execute([*make, "MPI=0", gencode_, f"BUILDDIR={tests}"], out=logf(f"nccl-tests-{tag}-build")):
            log(f"nccl-tests against NCCL {tag} failed to build")
    # The two-hosts shape runs the MPI build (see nccl_test).
    mpi = mpi_home()
    if now.shape == "hosts" and mpi and not executable(f"{mpi_build_of(tests)}/all_reduce_perf"):
        if execute([*make, "MPI=1", f"MPI_HOME={mpi}", gencode_, f"BUILDDIR={mpi_build_of(tests)}"],
                   out=logf(f"nccl-tests-mpi-{tag}-build")):
            log(f"nccl-tests (MPI) against NCCL {tag} failed to build")
    log(f"NCCL {tag}: built")


def stage_ncclbuild():
    """build NCCL from the source tarballs in $NCCL_SRC_DIR (those named in $NCCL_TAGS, default
    all), and nccl-tests against each (cached)"""
    flags = gencode()
    if now.dry:
        for tag in nccl_tags():
            build_nccl(tag, flags)
        return
    builds = [threading.Thread(target=build_nccl, args=(tag, flags)) for tag in nccl_tags()]
    for b in builds:
        b.start()
    for b in builds:
        b.join()


def stage_fabtests():
    """build fabtests against the libfabric stage's build (cached), for ceiling and pingpong"""
    ft, src = f"{WORK}/fabtests", f"{WORK}/fabtests-src"
    if executable(f"{ft}/bin/fi_rdm_tagged_bw"):
        return
    # A libfabric unpacked from an older builds.tar.xz has no headers: build it here first.
    if not os.path.isfile(f"{LF}/include/rdma/fabric.h"):
        remove(LF)
        stage_libfabric()
    remove(src)
    mkdirs(src)
    if execute(["tar", "-xJf", LIBFABRIC_TARBALL, "-C", src, "--strip-components=1"]):
        raise Failed()
    need(executable(f"{src}/fabtests/configure"), "no configure in fabtests (run scripts/gpu/prepare.sh again)")
    log("building fabtests")
    build = logf("fabtests-build")
    cpus = len(os.sched_getaffinity(0))
    rc = execute(["./configure", f"--prefix={ft}", f"--with-libfabric={LF}"], out=build, cwd=f"{src}/fabtests") \
        or execute(["make", f"-j{cpus}", "install"], out=build, append=True, cwd=f"{src}/fabtests")
    failed_build(rc, build, 30)
