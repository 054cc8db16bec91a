#!/usr/bin/env bash
# Real NCCL through the plugin on a GPU machine: builds libfabric with CUDA support, then runs
# nccl-tests and a PyTorch all-reduce with every byte crossing the plugin, and writes logs and
# a summary table.
#
# Usage: scripts/gpu/run.sh STAGE...
#   libfabric    build libfabric 2.1 with --with-cuda --enable-cuda-dlopen (cached)
#   nccltests    build nccl-tests from $NCCL_TESTS_SRC against the NCCL PyTorch loads, with
#                MPI=0 and (where mpicc is found) MPI=1 (cached)
#   doctor       the plugin's provider report on this machine (libfabric with CUDA)
#   loading      NCCL_NET_PLUGIN=<path>, NCCL_NET_PLUGIN=fabric and LD_PRELOAD, INFO/TRACE lines
#   allreduce    all_reduce_perf: Socket, tcp;ofi_rxm, shm
#   variants     all_reduce_perf without progress threads, with 1 lane, shm at 2 channels, shm's
#                endpoints shared; native tcp refused
#   compare      all_reduce_perf side by side: Socket (as shipped and 4 threads x 4 sockets), and
#                tcp;ofi_rxm and shm through the plugin in $BASELINE_DIR and through this one,
#                each with CPU seconds and peak RSS of the run
#   collectives  all_reduce, all_gather, sendrecv, alltoall: Socket, tcp;ofi_rxm, native tcp, shm
#   mpi          all_reduce_perf as 2 processes (mpirun): Socket, tcp;ofi_rxm, native tcp, shm
#   torch        torch.distributed all-reduce, 2 processes (torchrun), result checked
#   torchbw      all-reduce bandwidth at 1 GiB through torch.distributed (torchrun, 2 processes):
#                Socket (as shipped and 4 threads x 4 sockets), tcp;ofi_rxm, shm; CPU and RSS
#   torchhosts   torchbw, idle and churn as two hosts on one GPU (AS_HOSTS=1, MPS): Socket as
#                shipped, 4x4, 2x8 and the plugin with no NCCL_FABRIC_* set
#   churn        40 process groups created, used and destroyed one after another (torchrun,
#                2 processes): Socket, tcp;ofi_rxm, shm
#   latency      8-byte all_reduce_perf (2000 iterations): Socket, tcp;ofi_rxm, shm
#                (or $LATENCY_RUNS: socket fabric rxm shm, repeats allowed)
#   memory       all_reduce_perf with the peak memory broken down by kind of mapping:
#                Socket, tcp;ofi_rxm and the variants in $MEMORY_RUNS, shm
#   bound        all_reduce_perf, mpirun -np 2 with its default binding: Socket, the plugin as it
#                sizes itself, and lane/thread variants
#   idle         a torch job that all-reduces, idles 10 s and all-reduces again: cores used while
#                idle and RSS per process, Socket against the plugin (and the baseline plugin)
#   ncclbuild    build NCCL from the source tarballs in $NCCL_SRC_DIR (those named in $NCCL_TAGS,
#                default all), and nccl-tests against each (cached)
#   versions     all_reduce, alltoall and sendrecv through the plugin with every NCCL built by
#                ncclbuild and with PyTorch's: which table NCCL loaded, #wrong, grouped receives
#   runs         the runs listed in $RUNS_FILE, one per line: NAME TEST socket|fabric [VAR=VALUE ...]
#   pack         the libfabric and nccl-tests builds as $OUT/builds.tar.xz, to unpack into
#                .scratch/gpu-work on the next machine (the libfabric and nccltests stages
#                then find them built)
#   hosts        two ranks as two hosts on one GPU (MPS, NCCL_HOSTID per rank, mpirun -np 2
#                --bind-to none), all_reduce_perf -f 2: the plugin with no NCCL_FABRIC_* set and
#                with $HOSTS_FABRIC_VARIANTS, Socket as shipped, 4x4 and 2x8; CPU seconds, peak
#                RSS, the plugin's INFO lines, which NET devices NCCL's channels use, and the
#                time per size side by side (scripts/gpu/sizes.py). A variant holding the word
#                `baseline` runs the plugin in $BASELINE_DIR; HOSTS_NO_SOCKET=1 skips Socket,
#                HOSTS_SOCKETS picks its shapes (default "socket socket4x4 socket2x8");
#                HOSTS_TEST names another nccl-tests binary (sendrecv_perf, alltoall_perf …);
#                HOSTS_BIND replaces mpirun's "--bind-to none" ("--bind-to core": one core per
#                rank, mpirun's default), HOSTS_TAG names the runs apart and HOSTS_ENV
#                (VAR=VALUE ...) goes to every run, Socket's too; with NCCL_FABRIC_TIMES=yes
#                there, the plugin's comms' times are listed too
#   pingpong     one small message's one-way time: a polled TCP socket (tcp_pingpong.c) and
#                fabtests over $PINGPONG_PROVIDERS (tcp;ofi_rxm tcp), for each of $PINGPONG_OPS
#                ("tagged": fi_rdm_tagged_pingpong; "writedata": fi_rma_pingpong -o writedata)
#   ceiling      what the provider itself moves here (fabtests, built against the libfabric
#                stage's build): for each of $CEILING_OPS ("tagged": fi_rdm_tagged_bw, the
#                default; "writedata": fi_rma_bw -o writedata, RMA writes with remote CQ data),
#                each of $CEILING_SIZE (message bytes, 1048576) and $CEILING_WINDOW (in flight
#                per flow, 64) and $CEILING_FLOWS flows each way (default "1 2 4"), both
#                directions at once, $CEILING_PROVIDER (tcp;ofi_rxm) over eth0's address; the
#                sum of the flows' MB/s per direction; each flow moves 3 GiB
#                ($CEILING_ITERS messages if set)
#   ucx          libfabric 2.1 built with CUDA and the ucx provider against the UCX in
#                $UCX_TARBALL (include/ and lib/ of the libucx-cu13 wheel, see the shared notes), then
#                fi_info -p ucx and the plugin's doctor with NCCL_FABRIC_PROVIDER=ucx
#                (FI_UCX_DEVICES=eth0, UCX_TLS=tcp,cuda_copy,self)
#   threads      where the CPU goes at 1 GiB (two ranks as two hosts): CPU seconds by thread name
#                for Socket 2x8 and the plugin, and perf profiles of both where perf is installed
#                or comes in $PERF_TARBALL
#   steps        where the time of NCCL's network steps goes (NCCL's example profiler plugin from
#                $NCCL_PROFILER_TARBALL; scripts/gpu/steps.py): all_reduce_perf at $STEPS_SIZES
#                (8 1M 256M), Socket as shipped and 2x8, the plugin and $STEPS_VARIANTS;
#                $STEPS_TEST names another nccl-tests binary (sendrecv_perf …)
#   conform      nccl-net-fabric conform over ucx (GPU rows included) and $CONFORM_PROVIDERS
#   ucxhosts     the hosts shape over ucx: GPU buffers (NCCL_NET_GDR_LEVEL=SYS), host buffers
#                (NCCL_FABRIC_HMEM=off) and Socket for each of $UCXHOSTS_TESTS (all_reduce_perf
#                sendrecv_perf alltoall_perf), all_reduce also without the GDR setting; NCCL's
#                GPU Direct RDMA lines, /GDRDMA channels and the plugin's INFO lines
#   capped       the hosts shape with every TCP connection on the ranks' path capped at $CAP_RATE
#                (default 2gbit), the way clouds cap each flow: an HTB class per connection on lo
#                (which carries eth0-to-eth0 traffic here), made as connections appear
#                (scripts/gpu/capflows.py; the kernel there has no fq), removed afterwards;
#                $CAPPED_TEST (all_reduce_perf), Socket as shipped, 4x4, 2x8 and the plugin
#                ($HOSTS_FABRIC_VARIANTS as in hosts, default none)
#   scale        tests/scale.rs on this machine's cores: $SCALE_HOSTS (default "16 8")
#                network-namespace hosts all to all, a host killed and a link cut; the test's
#                release build and the plugin beside it in $SCALE_DIR (scripts/gpu/prepare.sh),
#                iproute2's ip from $IP_TARBALL where the machine has none
#   targets      what the performance targets compare, two ranks as two hosts, as much as fits in
#                $TARGETS_BUDGET seconds of the script (default 540; what does not fit is named
#                in the summary): all_reduce_perf -b 8 -e 1G (Socket as shipped, 4x4, 2x8, the
#                plugin and $HOSTS_FABRIC_VARIANTS), sendrecv_perf and alltoall_perf -b 8 -e 256M,
#                mpirun's default binding (one core per rank; also with progress threads),
#                torchhosts; $TARGETS_PARTS picks
#                (default "allreduce sendrecv alltoall bound torch")
#   all          libfabric nccltests doctor loading collectives variants mpi torch (about 10 min)
#   issue10      libfabric nccltests compare torch loading
#
# scripts/gpu/prepare.sh makes the inputs on the Debian build machine. Inputs (environment):
#   PLUGIN_DIR        folder with libnccl_net_fabric.so and nccl-net-fabric (default .scratch/gpu-in/plugin)
#   BASELINE_DIR      folder with an earlier libnccl_net_fabric.so, for compare (default .scratch/gpu-in/baseline)
#   LIBFABRIC_TARBALL libfabric source: a tree prepared with ./autogen.sh (GPU machines may have no
#                     libtool) or the orig tarball (default: whichever is in .scratch/gpu-in)
#   NCCL_TESTS_SRC    a copy of NVIDIA/nccl-tests, kept out of this repository (default .scratch/gpu-in/nccl-tests)
#   NCCL_SRC_DIR      NCCL source tarballs nccl-<tag>.tar.xz (git archive of NVIDIA/nccl tags, kept
#                     out of this repository; default .scratch/gpu-in/nccl-src)
#   NCCL_TESTS_DIR    nccl-tests build folder with the *_perf binaries (default: what the nccltests stage built)
#   NCCL_TESTS_MPI_DIR the same built with MPI=1 (for the mpi stage; default: what the nccltests stage built)
#   NCCL_PROFILER_TARBALL ext-profiler/example of NCCL's source, for the steps stage (kept out of
#                     this repository; default .scratch/gpu-in/nccl-profiler.tar.xz)
#   PERF_TARBALL      perf and its libraries (scripts/gpu/prepare.sh; default .scratch/gpu-in/perf.tar.xz)
#   OUT               where logs and summary.md go (default .scratch/gpu-out)
#   TIMEOUT           seconds allowed per benchmark (default 150): a run past it counts as a hang
#   ITERS, WARMUP     nccl-tests -n / -w (default 10 / 3)
#   COMPARE_ROUNDS    rounds of the compare stage (default 2)
#   MINBYTES, MAXBYTES nccl-tests -b / -e (default 1M / 1G)
#   MPI_RUNS, BOUND_RUNS which runs the mpi and bound stages make (default: all they know)
#   MEMORY_RUNS   extra runs of the memory stage, NAME:VAR=VALUE,VAR=VALUE (tcp;ofi_rxm)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

in=$repo/.scratch/gpu-in
PLUGIN_DIR=${PLUGIN_DIR:-$in/plugin}
BASELINE_DIR=${BASELINE_DIR:-$in/baseline}
LIBFABRIC_TARBALL=${LIBFABRIC_TARBALL:-$(ls "$in"/libfabric-2.1.0-autogen.tar.xz "$in"/libfabric_2.1.0.orig.tar.xz 2>/dev/null | head -n1)}
NCCL_TESTS_SRC=${NCCL_TESTS_SRC:-$in/nccl-tests}
NCCL_SRC_DIR=${NCCL_SRC_DIR:-$in/nccl-src}
NCCL_PROFILER_TARBALL=${NCCL_PROFILER_TARBALL:-$in/nccl-profiler.tar.xz}
PERF_TARBALL=${PERF_TARBALL:-$in/perf.tar.xz}
OUT=${OUT:-$repo/.scratch/gpu-out}
TIMEOUT=${TIMEOUT:-150}
ITERS=${ITERS:-10}
MINBYTES=${MINBYTES:-1M}
MAXBYTES=${MAXBYTES:-1G}
WARMUP=${WARMUP:-3}
work=$repo/.scratch/gpu-work
lf=$work/libfabric-cuda
NCCL_TESTS_DIR=${NCCL_TESTS_DIR:-$work/nccl-tests}
NCCL_TESTS_MPI_DIR=${NCCL_TESTS_MPI_DIR:-$work/nccl-tests-mpi}
mkdir -p "$OUT/logs" "$work"
summary=$OUT/summary.md

# Never let NVLink multicast be used on a shared machine.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

log() { echo "[gpu $(date +%H:%M:%S)] $*" >&2; }

# The shape of the runs: "gpus" (two GPUs in one process, -g 2) where the machine has two GPUs,
# else "hosts" (two ranks as two hosts on GPU 0: MPS, mpirun -np 2, NCCL_HOSTID per rank, -g 1,
# the MPI build of nccl-tests; torch scripts get AS_HOSTS=1). SHAPE=hosts forces the second.
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
SHAPE=${SHAPE:-$([ "$GPUS" -ge 2 ] && echo gpus || echo hosts)}
[ "$SHAPE" = hosts ] && export AS_HOSTS=1
# The script `bash -c "$AS_HOST_SH" _ [VAR=VALUE ...] COMMAND ...` runs under mpirun to make
# each rank a host of its own on GPU 0 (exported: nccl_test runs in a shell of its own).
export AS_HOST_SH='export NCCL_HOSTID=h$OMPI_COMM_WORLD_RANK NCCL_TESTS_DEVICE=0; exec env "$@"'
# What mpirun runs before a rank's command in the hosts shape (nothing in the gpus shape).
AS_HOST=()
[ "$SHAPE" = hosts ] && AS_HOST=(bash -c "$AS_HOST_SH" _)
shape_words() {
  if [ "$SHAPE" = gpus ]; then echo "2 GPUs in one process (-g 2)"; else echo "two ranks as two hosts on one GPU (MPS)"; fi
}

# The NCCL that PyTorch loads: nccl-tests link and run against it.
nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
[ -n "$nccl_dir" ] && export LD_LIBRARY_PATH=$nccl_dir/lib:${LD_LIBRARY_PATH:-}


# The plugin under the names NCCL looks for.
install_plugin() {
  local lib=$work/plugin
  mkdir -p "$lib"
  cp -f "$PLUGIN_DIR/libnccl_net_fabric.so" "$lib/libnccl-net-fabric.so"
  ln -sf libnccl-net-fabric.so "$lib/libnccl-net.so"
  echo "$lib"
}

stage_libfabric() {
  if [ -e "$lf/lib/libfabric.so" ]; then log "libfabric with CUDA: cached"; return 0; fi
  log "building libfabric 2.1 with CUDA"
  LIBFABRIC_PREFIX=$lf LIBFABRIC_TARBALL=$LIBFABRIC_TARBALL \
    LIBFABRIC_CONFIGURE_EXTRA="--with-cuda=/usr/local/cuda --enable-cuda-dlopen" \
    bash scripts/build-libfabric.sh >"$OUT/logs/libfabric-build.log" 2>&1 \
    || { tail -n 40 "$OUT/logs/libfabric-build.log" >&2; return 1; }
}

# Where mpi.h lives, as nccl-tests' MPI_HOME (its include/ and lib/); empty if none.
mpi_home() {
  local d
  for d in $(mpicc --showme:incdirs 2>/dev/null) /usr/lib/x86_64-linux-gnu/openmpi/include; do
    if [ -f "$d/mpi.h" ] && [ -d "$d/../lib" ]; then (cd "$d/.." && pwd); return 0; fi
  done
}

stage_nccltests() {
  [ -f "$NCCL_TESTS_SRC/src/Makefile" ] || { log "no nccl-tests source in $NCCL_TESTS_SRC"; return 1; }
  [ -n "$nccl_dir" ] || { log "no NCCL found (python3 -c 'import nvidia.nccl')"; return 1; }
  local home=$work/nccl-home cap mpi
  mkdir -p "$home/lib"
  ln -sf "$nccl_dir/lib/libnccl.so.2" "$home/lib/libnccl.so"
  ln -sfn "$nccl_dir/include" "$home/include"
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '. ')
  local args=(-C "$NCCL_TESTS_SRC/src" -j16 CUDA_HOME=/usr/local/cuda NCCL_HOME="$home"
    NVCC_GENCODE="-gencode=arch=compute_$cap,code=sm_$cap")
  if [ ! -x "$NCCL_TESTS_DIR/all_reduce_perf" ]; then
    make "${args[@]}" MPI=0 BUILDDIR="$NCCL_TESTS_DIR" >"$OUT/logs/nccl-tests-build.log" 2>&1 &
  fi
  mpi=$(mpi_home)
  if [ -n "$mpi" ] && [ ! -x "$NCCL_TESTS_MPI_DIR/all_reduce_perf" ]; then
    make "${args[@]}" MPI=1 MPI_HOME="$mpi" BUILDDIR="$NCCL_TESTS_MPI_DIR" \
      >"$OUT/logs/nccl-tests-mpi-build.log" 2>&1 &
  fi
  wait
  [ -x "$NCCL_TESTS_DIR/all_reduce_perf" ] || { tail -n 20 "$OUT/logs/nccl-tests-build.log" >&2; return 1; }
  [ -x "$NCCL_TESTS_MPI_DIR/all_reduce_perf" ] || log "no MPI build of nccl-tests (mpi.h: ${mpi:-not found})"
}

plugin_env() {
  export LD_LIBRARY_PATH=$lf/lib:${LD_LIBRARY_PATH:-}
  PLUGIN_LIB=$(install_plugin)
  if [ "$SHAPE" = hosts ]; then start_mps; fi
}

# nccl_test TESTS_DIR TEST ARG...: runs (exec) one nccl-tests binary in the machine's shape (see
# SHAPE): from TESTS_DIR with -g 2, or as two ranks, two hosts, from its MPI build with -g 1
# ($NCCL_TESTS_MPI_DIR for $NCCL_TESTS_DIR, nccl-tests-mpi-TAG beside nccl-tests-TAG). The caller's environment reaches the
# ranks. Exported: `timeout … bash -c 'nccl_test "$@"' _ …` puts a time limit on it.
nccl_test() {
  local dir=$1 test=$2
  shift 2
  if [ "$SHAPE" = gpus ]; then
    exec "$dir/$test" "$@" -g 2
  else
    exec mpirun --allow-run-as-root ${HOSTS_BIND:---bind-to none} -np 2 \
      bash -c "$AS_HOST_SH" _ "$(mpi_build_of "$dir")/$test" "$@" -g 1
  fi
}
mpi_build_of() {
  if [ "$1" = "$NCCL_TESTS_DIR" ]; then echo "$NCCL_TESTS_MPI_DIR"; else echo "${1%/*}/nccl-tests-mpi${1##*/nccl-tests}"; fi
}
export -f nccl_test mpi_build_of
export SHAPE NCCL_TESTS_DIR NCCL_TESTS_MPI_DIR

stage_doctor() {
  plugin_env
  {
    echo "## doctor on $(hostname) ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
    echo '```'
    "$PLUGIN_DIR/nccl-net-fabric" doctor 2>&1
    echo
    FI_PROVIDER=shm "$PLUGIN_DIR/nccl-net-fabric" doctor 2>&1 | tail -n 3
    echo '```'
  } >>"$summary"
}

# run NAME TEST [VAR=VALUE ...]: one nccl-tests run through the plugin (or Socket), timed out
# at $TIMEOUT, its CPU seconds and peak RSS measured; appends a summary row.
run() {
  local name=$1 test=$2
  shift 2
  local logf=$OUT/logs/$name.log cost=$OUT/logs/$name.cost
  log "run $name ($test)"
  local start=$SECONDS
  rm -f "$cost"
  env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" \
    python3 scripts/gpu/measure.py "$cost" \
    timeout -k 10 "$TIMEOUT" bash -c 'nccl_test "$@"' _ "$NCCL_TESTS_DIR" "$test" -b "$MINBYTES" -e "$MAXBYTES" -f 4 -n "$ITERS" -w "$WARMUP" \
    >"$logf" 2>&1
  local rc=$?
  row "$name" "$test" "$logf" "$rc" $((SECONDS - start)) "$(cat "$cost" 2>/dev/null)"
}

# row NAME TEST LOG RC SECONDS [COST]: summary line from an nccl-tests log.
row() {
  local name=$1 test=$2 logf=$3 rc=$4 secs=$5 cost=${6:-}
  local avg gib wrong via status
  avg=$(awk -F: '/Avg bus bandwidth/ {gsub(/[ A-Z]/,"",$2); print $2}' "$logf" | tail -1)
  gib=$(awk '$1 == 1073741824 && NF >= 13 {print $8}' "$logf" | tail -1)
  wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {w += $9 + $13} END {print w + 0}' "$logf")
  via=$(grep -m1 -o 'via NET/[A-Za-z]*' "$logf" | head -1)
  case $rc in
    0) status=ok ;;
    124 | 137) status="HUNG (killed after ${TIMEOUT}s)" ;;
    *) status="failed rc=$rc" ;;
  esac
  echo "| $name | $test | ${via:-?} | ${gib:--} | ${avg:--} | $wrong | $status | ${secs}s | ${cost% rc=*} |" >>"$summary"
}

table_header() {
  {
    echo
    echo "## $1"
    echo
    echo "| run | test | path | busbw @1 GiB (GB/s) | avg busbw (GB/s) | #wrong | status | time | cost |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  } >>"$summary"
}

fabric() { echo NCCL_NET=Fabric NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so"; }
socket() { echo NCCL_NET=Socket NCCL_NET_PLUGIN=none; }
# socket_shape socket|socket4x4|socket2x8: Socket as shipped, 4 threads x 4 sockets, 2 x 8.
socket_shape() {
  case $1 in
    socket) socket ;;
    socket4x4) echo "$(socket) NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" ;;
    socket2x8) echo "$(socket) NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=8" ;;
  esac
}

stage_allreduce() {
  plugin_env
  table_header "all_reduce_perf, $(shape_words), P2P and SHM off"
  run socket-all_reduce all_reduce_perf $(socket)
  run rxm-all_reduce all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm"
  run shm-all_reduce all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER=shm
}

stage_variants() {
  plugin_env
  table_header "all_reduce_perf variants: progress threads, lanes, channels, endpoint sharing; native tcp refused"
  run rxm-nothreads-all_reduce all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" NCCL_FABRIC_PROGRESS_THREAD=no
  run rxm-1lane-all_reduce all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" NCCL_FABRIC_LANES=1
  run shm-nothreads-all_reduce all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER=shm NCCL_FABRIC_PROGRESS_THREAD=no
  run shm-100g-all_reduce all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER=shm NCCL_FABRIC_SPEED_MBPS=100000
  run shm-device-all_reduce all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER=shm NCCL_FABRIC_ENDPOINTS=device
  run tcp-refused all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER=tcp
  grep -h "NET/Fabric\|NET plugin" "$OUT/logs/tcp-refused.log" | cut -c1-400 | head -n 4 >"$OUT/tcp-refused.txt"
}

stage_compare() {
  plugin_env
  local base=$work/baseline
  mkdir -p "$base"
  cp -f "$BASELINE_DIR/libnccl_net_fabric.so" "$base/libnccl-net-fabric.so"
  local old="NCCL_NET=Fabric NCCL_NET_PLUGIN=$base/libnccl-net-fabric.so"
  table_header "all_reduce_perf side by side: $(basename "$BASELINE_DIR") plugin and this one, $(shape_words), P2P and SHM off"
  run socket-all_reduce all_reduce_perf $(socket)
  run socket4x4-all_reduce all_reduce_perf $(socket_shape socket4x4)
  local round
  for round in $(seq "${COMPARE_ROUNDS:-2}"); do
    # shellcheck disable=SC2086
    run "before-rxm-$round" all_reduce_perf $old NCCL_FABRIC_PROVIDER="tcp;ofi_rxm"
    run "after-rxm-$round" all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm"
    # shellcheck disable=SC2086
    run "before-shm-$round" all_reduce_perf $old NCCL_FABRIC_PROVIDER=shm
    run "after-shm-$round" all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER=shm
  done
}

stage_runs() {
  plugin_env
  table_header "runs from $(basename "${RUNS_FILE:?set RUNS_FILE}")"
  local name test how rest
  while read -r name test how rest; do
    [ -n "$name" ] && [ "${name#\#}" = "$name" ] || continue
    # shellcheck disable=SC2086
    run "$name" "$test" $($how) $rest
  done <"$RUNS_FILE"
}

stage_collectives() {
  plugin_env
  table_header "four collectives, $(shape_words), P2P and SHM off"
  for t in all_reduce_perf all_gather_perf sendrecv_perf alltoall_perf; do
    run "socket-${t%_perf}" "$t" $(socket)
    run "rxm-${t%_perf}" "$t" $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm"
    run "tcp-${t%_perf}" "$t" $(fabric) NCCL_FABRIC_PROVIDER=tcp NCCL_FABRIC_ALLOW_NATIVE_TCP=yes
    run "shm-${t%_perf}" "$t" $(fabric) NCCL_FABRIC_PROVIDER=shm
  done
}

stage_loading() {
  plugin_env
  local small=(-b 1M -e 4M -f 4 -n 5 -w 1)
  {
    echo
    echo "## loading"
    echo
  } >>"$summary"
  local how
  for how in path name preload; do
    local logf=$OUT/logs/loading-$how.log
    case $how in
      path) set -- NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so" ;;
      name) set -- NCCL_NET_PLUGIN=fabric LD_LIBRARY_PATH="$PLUGIN_LIB:$LD_LIBRARY_PATH" ;;
      preload) set -- LD_PRELOAD="$PLUGIN_LIB/libnccl-net.so" ;;
    esac
    env -u NCCL_NET_PLUGIN NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Fabric NCCL_DEBUG=INFO \
      NCCL_DEBUG_SUBSYS=INIT,NET "$@" timeout -k 10 "$TIMEOUT" bash -c 'nccl_test "$@"' _ \
      "$NCCL_TESTS_DIR" all_reduce_perf "${small[@]}" >"$logf" 2>&1
    local rc=$?
    local loaded
    loaded=$(grep -m1 -o 'Loaded net plugin [^ ]* ([^)]*)' "$logf")
    echo "- $how: rc=$rc, ${loaded:-plugin not loaded}, $(grep -c 'via NET/Fabric' "$logf") channels via NET/Fabric" >>"$summary"
  done
  # What a user sees: INFO with subsystems INIT,NET, and TRACE.
  grep -h "NET/Fabric\|NET/Plugin\|via NET" "$OUT/logs/loading-path.log" | sort -u | head -n 20 >"$OUT/info-lines.txt"
  env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Fabric NCCL_DEBUG=TRACE \
    NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so" timeout -k 10 "$TIMEOUT" bash -c 'nccl_test "$@"' _ \
    "$NCCL_TESTS_DIR" all_reduce_perf -b 1M -e 1M -n 1 -w 0 >"$OUT/logs/trace.log" 2>&1
  grep -h "NET/Fabric" "$OUT/logs/trace.log" | sort -u | head -n 40 >"$OUT/trace-lines.txt"
}

stage_mpi() {
  plugin_env
  local dir=$NCCL_TESTS_MPI_DIR
  if [ ! -x "$dir/all_reduce_perf" ]; then
    echo "- mpi: skipped (no nccl-tests built with MPI=1)" >>"$summary"
    return 0
  fi
  table_header "all_reduce_perf, 2 processes (mpirun -np 2, -g 1$([ "$SHAPE" = hosts ] && echo ", each a host on GPU 0")), P2P and SHM off"
  local name
  local fab=(-x NCCL_NET=Fabric -x NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so")
  for name in ${MPI_RUNS:-socket socket4x4 rxm tcp shm}; do
    local extra
    case $name in
      socket) extra=(-x NCCL_NET=Socket -x NCCL_NET_PLUGIN=none) ;;
      socket4x4) extra=(-x NCCL_NET=Socket -x NCCL_NET_PLUGIN=none -x NCCL_SOCKET_NTHREADS=4 -x NCCL_NSOCKS_PERTHREAD=4) ;;
      rxm) extra=("${fab[@]}" -x NCCL_FABRIC_PROVIDER="tcp;ofi_rxm") ;;
      tcp) extra=("${fab[@]}" -x NCCL_FABRIC_PROVIDER=tcp -x NCCL_FABRIC_ALLOW_NATIVE_TCP=yes) ;;
      shm) extra=("${fab[@]}" -x NCCL_FABRIC_PROVIDER=shm) ;;
    esac
    local logf=$OUT/logs/mpi-$name.log start=$SECONDS cost=$OUT/logs/mpi-$name.cost
    rm -f "$cost"
    python3 scripts/gpu/measure.py "$cost" timeout -k 10 "$TIMEOUT" mpirun --allow-run-as-root --bind-to none -np 2 \
      -x LD_LIBRARY_PATH -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_NVLS_ENABLE=0 \
      -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET "${extra[@]}" "${AS_HOST[@]}" \
      "$dir/all_reduce_perf" -b "$MINBYTES" -e "$MAXBYTES" -f 4 -g 1 -n "$ITERS" -w "$WARMUP" >"$logf" 2>&1
    row "mpi-$name" all_reduce_perf "$logf" $? $((SECONDS - start)) "$(cat "$cost" 2>/dev/null)"
  done
}

# all_reduce_perf as 2 processes with mpirun's default binding (one core per rank): Socket
# against the plugin as it sizes itself there, and variants of lanes and threads.
stage_bound() {
  plugin_env
  local dir=$NCCL_TESTS_MPI_DIR
  [ -x "$dir/all_reduce_perf" ] || { echo "- bound: skipped (no MPI build)" >>"$summary"; return 0; }
  table_header "all_reduce_perf, mpirun -np 2 with its default binding (one core per rank), -g 1"
  local fab=(-x NCCL_NET=Fabric -x NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so")
  local name
  for name in ${BOUND_RUNS:-socket rxm rxm-4lanes rxm-2lanes-threads shm shm-threads}; do
    local extra
    case $name in
      socket) extra=(-x NCCL_NET=Socket -x NCCL_NET_PLUGIN=none) ;;
      rxm) extra=("${fab[@]}" -x NCCL_FABRIC_PROVIDER="tcp;ofi_rxm") ;;
      rxm-4lanes) extra=("${fab[@]}" -x NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" -x NCCL_FABRIC_LANES=4) ;;
      rxm-2lanes-threads) extra=("${fab[@]}" -x NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" -x NCCL_FABRIC_LANES=2 -x NCCL_FABRIC_PROGRESS_THREAD=yes) ;;
      shm) extra=("${fab[@]}" -x NCCL_FABRIC_PROVIDER=shm) ;;
      shm-threads) extra=("${fab[@]}" -x NCCL_FABRIC_PROVIDER=shm -x NCCL_FABRIC_PROGRESS_THREAD=yes) ;;
    esac
    local logf=$OUT/logs/bound-$name.log start=$SECONDS
    timeout -k 10 "$TIMEOUT" mpirun --allow-run-as-root -np 2 \
      -x LD_LIBRARY_PATH -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_NVLS_ENABLE=0 \
      -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET "${extra[@]}" "${AS_HOST[@]}" \
      "$dir/all_reduce_perf" -b "$MINBYTES" -e "$MAXBYTES" -f 4 -g 1 -n "$ITERS" -w "$WARMUP" >"$logf" 2>&1
    row "bound-$name" all_reduce_perf "$logf" $? $((SECONDS - start))
  done
  grep -h -m1 "sizing:" "$OUT/logs/bound-rxm.log" | cut -c1-400 >>"$summary"
}

# The NCCL tags ncclbuild finds (or $NCCL_TAGS).
nccl_tags() {
  if [ -n "${NCCL_TAGS:-}" ]; then echo "$NCCL_TAGS"; return; fi
  local f
  for f in "$NCCL_SRC_DIR"/nccl-*.tar.xz; do
    [ -e "$f" ] && basename "$f" .tar.xz | sed 's/^nccl-//'
  done
}

stage_ncclbuild() {
  local cap tag
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '. ')
  for tag in $(nccl_tags); do
    (
      local src=$work/nccl-$tag build=$work/nccl-$tag/build tests=$work/nccl-tests-$tag
      if [ ! -e "$build/lib/libnccl.so" ]; then
        rm -rf "$src" && mkdir -p "$work" && tar -xJf "$NCCL_SRC_DIR/nccl-$tag.tar.xz" -C "$work"
        make -C "$src" -j16 src.build CUDA_HOME=/usr/local/cuda BUILDDIR="$build" \
          NVCC_GENCODE="-gencode=arch=compute_$cap,code=sm_$cap" >"$OUT/logs/nccl-$tag-build.log" 2>&1 \
          || { log "NCCL $tag does not build here: $(tail -n 3 "$OUT/logs/nccl-$tag-build.log" | tr '\n' ' ' | cut -c1-300)"; exit 1; }
      fi
      if [ ! -x "$tests/all_reduce_perf" ]; then
        make -C "$NCCL_TESTS_SRC/src" -j8 CUDA_HOME=/usr/local/cuda NCCL_HOME="$build" MPI=0 \
          NVCC_GENCODE="-gencode=arch=compute_$cap,code=sm_$cap" BUILDDIR="$tests" \
          >"$OUT/logs/nccl-tests-$tag-build.log" 2>&1 || log "nccl-tests against NCCL $tag failed to build"
      fi
      # The two-hosts shape runs the MPI build (see nccl_test).
      local mpi
      mpi=$(mpi_home)
      if [ "$SHAPE" = hosts ] && [ -n "$mpi" ] && [ ! -x "$(mpi_build_of "$tests")/all_reduce_perf" ]; then
        make -C "$NCCL_TESTS_SRC/src" -j8 CUDA_HOME=/usr/local/cuda NCCL_HOME="$build" MPI=1 MPI_HOME="$mpi" \
          NVCC_GENCODE="-gencode=arch=compute_$cap,code=sm_$cap" BUILDDIR="$(mpi_build_of "$tests")" \
          >"$OUT/logs/nccl-tests-mpi-$tag-build.log" 2>&1 || log "nccl-tests (MPI) against NCCL $tag failed to build"
      fi
      log "NCCL $tag: built"
    ) &
  done
  wait
}

# versions_row LABEL LIBDIR TESTSDIR: the three collectives with one NCCL, one summary row.
versions_row() {
  local label=$1 libdir=$2 tests=$3 t name logf cells="" loaded grouped=0 rc
  for t in all_reduce_perf alltoall_perf sendrecv_perf; do
    name=versions-$label-${t%_perf}
    logf=$OUT/logs/$name.log
    log "run $name"
    env LD_LIBRARY_PATH="$libdir:$LD_LIBRARY_PATH" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" \
      timeout -k 10 "$TIMEOUT" bash -c 'nccl_test "$@"' _ "$tests" "$t" -b 1M -e 64M -f 4 -n 5 -w 2 >"$logf" 2>&1
    rc=$?
    local wrong
    wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {w += $9 + $13} END {print w + 0}' "$logf")
    cells="$cells | rc=$rc, #wrong $wrong"
    grouped=$((grouped + $(grep -c 'grouped receive of' "$logf")))
  done
  loaded=$(grep -h -o 'Loaded net plugin [A-Za-z]* (v[0-9]*)' "$OUT"/logs/versions-"$label"-*.log | sort -u | tr '\n' ' ')
  echo "| $label | ${loaded:-none}$cells | $grouped |" >>"$summary"
}

stage_versions() {
  plugin_env
  {
    echo
    echo "## NCCL versions: which table each loads, and three collectives through it (tcp;ofi_rxm, $(shape_words), P2P and SHM off, 1M-64M)"
    echo
    echo "| NCCL | table loaded | all_reduce | alltoall | sendrecv | grouped-receive INFO lines |"
    echo "| --- | --- | --- | --- | --- | --- |"
  } >>"$summary"
  versions_row "2.28.9-pip" "$nccl_dir/lib" "$NCCL_TESTS_DIR"
  local tag
  for tag in $(nccl_tags); do
    if [ -e "$work/nccl-$tag/build/lib/libnccl.so" ] && [ -x "$work/nccl-tests-$tag/all_reduce_perf" ]; then
      versions_row "$tag" "$work/nccl-$tag/build/lib" "$work/nccl-tests-$tag"
    else
      echo "| $tag | not built (see logs/nccl-$tag-build.log) | - | - | - | - |" >>"$summary"
    fi
  done
}

stage_idle() {
  plugin_env
  {
    echo
    echo "## Idle cost (torchrun, 2 processes, all-reduce, 10 s idle, all-reduce; P2P and SHM off)"
    echo
  } >>"$summary"
  local how logf
  for how in socket fabric-rxm fabric-shm baseline-rxm; do
    logf=$OUT/logs/idle-$how.log
    case $how in
      socket) set -- NCCL_NET=Socket NCCL_NET_PLUGIN=none ;;
      fabric-rxm) set -- $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" ;;
      fabric-shm) set -- $(fabric) NCCL_FABRIC_PROVIDER=shm ;;
      baseline-rxm)
        mkdir -p "$work/baseline" && cp -f "$BASELINE_DIR/libnccl_net_fabric.so" "$work/baseline/libnccl-net-fabric.so"
        set -- NCCL_NET=Fabric NCCL_NET_PLUGIN="$work/baseline/libnccl-net-fabric.so" NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" ;;
    esac
    env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "$@" timeout -k 10 "$TIMEOUT" \
      torchrun --standalone --nproc_per_node 2 scripts/gpu/torch_idle.py >"$logf" 2>&1
    echo "- $how (rc=$?): $(grep -o 'RESULT.*' "$logf" | tr '\n' ' ')" >>"$summary"
  done
}

# torchrun_measured NAME SCRIPT [VAR=VALUE ...]: a 2-process torchrun of SCRIPT, timed out at
# $TIMEOUT, with CPU seconds and peak memory; prints its RESULT lines and cost.
torchrun_measured() {
  local name=$1 script=$2
  shift 2
  local logf=$OUT/logs/$name.log cost=$OUT/logs/$name.cost start=$SECONDS
  log "run $name"
  rm -f "$cost"
  env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" \
    python3 scripts/gpu/measure.py "$cost" timeout -k 10 "$TIMEOUT" \
    torchrun --standalone --nproc_per_node 2 "$script" >"$logf" 2>&1
  echo "- $name (rc=$?, $((SECONDS - start)) s): $(grep -o 'RESULT.*' "$logf" | tr '\n' ' ') $(cat "$cost" 2>/dev/null)"
}

stage_torchbw() {
  plugin_env
  {
    echo
    echo "## all_reduce 1 GiB through torch.distributed (torchrun, 2 processes), P2P and SHM off"
    echo
    torchrun_measured torchbw-socket scripts/gpu/torch_bw.py $(socket)
    torchrun_measured torchbw-socket4x4 scripts/gpu/torch_bw.py $(socket_shape socket4x4)
    torchrun_measured torchbw-rxm scripts/gpu/torch_bw.py $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm"
    torchrun_measured torchbw-shm scripts/gpu/torch_bw.py $(fabric) NCCL_FABRIC_PROVIDER=shm
  } >>"$summary"
}

# torchhosts: the torch stages in the two-hosts shape (AS_HOSTS=1: NCCL_HOSTID per rank, one
# GPU under MPS): 1 GiB all-reduce bandwidth for Socket as shipped, 4x4, 2x8 and the plugin
# with no NCCL_FABRIC_* set; idle cores and RSS; 40 process groups one after another.
stage_torchhosts() {
  plugin_env
  start_mps
  local fab=(NCCL_NET=Fabric NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so")
  {
    echo
    echo "## torch.distributed as two hosts on one GPU (torchrun, 2 processes, AS_HOSTS=1), P2P and SHM off"
    echo
    torchrun_measured torchhosts-bw-socket scripts/gpu/torch_bw.py AS_HOSTS=1 $(socket)
    torchrun_measured torchhosts-bw-socket4x4 scripts/gpu/torch_bw.py AS_HOSTS=1 $(socket_shape socket4x4)
    torchrun_measured torchhosts-bw-socket2x8 scripts/gpu/torch_bw.py AS_HOSTS=1 $(socket_shape socket2x8)
    torchrun_measured torchhosts-bw-fabric scripts/gpu/torch_bw.py AS_HOSTS=1 "${fab[@]}"
    torchrun_measured torchhosts-idle-socket scripts/gpu/torch_idle.py AS_HOSTS=1 $(socket)
    torchrun_measured torchhosts-idle-fabric scripts/gpu/torch_idle.py AS_HOSTS=1 "${fab[@]}"
    torchrun_measured torchhosts-churn-socket scripts/gpu/torch_churn.py AS_HOSTS=1 $(socket)
    torchrun_measured torchhosts-churn-fabric scripts/gpu/torch_churn.py AS_HOSTS=1 "${fab[@]}"
    # Variants of the plugin (;-separated VAR=VALUE lists): bandwidth and churn again.
    local v i=0
    IFS=';' read -ra variants <<<"${TORCHHOSTS_FABRIC_VARIANTS:-}"
    for v in "${variants[@]}"; do
      i=$((i + 1))
      echo "- torchhosts-*-fabric-v$i: $v"
      # shellcheck disable=SC2086
      torchrun_measured torchhosts-bw-fabric-v$i scripts/gpu/torch_bw.py AS_HOSTS=1 "${fab[@]}" $v
      # shellcheck disable=SC2086
      torchrun_measured torchhosts-churn-fabric-v$i scripts/gpu/torch_churn.py AS_HOSTS=1 "${fab[@]}" $v
    done
  } >>"$summary"
}

stage_churn() {
  plugin_env
  {
    echo
    echo "## 40 process groups created, used and destroyed (torchrun, 2 processes), P2P and SHM off"
    echo
    torchrun_measured churn-socket scripts/gpu/torch_churn.py $(socket)
    torchrun_measured churn-rxm scripts/gpu/torch_churn.py $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm"
    torchrun_measured churn-shm scripts/gpu/torch_churn.py $(fabric) NCCL_FABRIC_PROVIDER=shm
  } >>"$summary"
}

stage_latency() {
  plugin_env
  {
    echo
    echo "## 8-byte all_reduce_perf ($(shape_words), -n 2000 -w 200), P2P and SHM off: time in us (out-of-place, in-place)"
    echo
  } >>"$summary"
  local name logf i=0
  # $LATENCY_RUNS: socket, fabric (no setting), rxm, shm, in that order (a name may repeat).
  for name in ${LATENCY_RUNS:-socket rxm shm}; do
    i=$((i + 1))
    logf=$OUT/logs/latency-$i-$name.log
    case $name in
      socket) set -- $(socket) ;;
      fabric) set -- $(fabric) ;;
      rxm) set -- $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" ;;
      shm) set -- $(fabric) NCCL_FABRIC_PROVIDER=shm ;;
    esac
    log "run latency-$i-$name"
    env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" \
      timeout -k 10 "$TIMEOUT" bash -c 'nccl_test "$@"' _ "$NCCL_TESTS_DIR" all_reduce_perf -b 8 -e 8 -n 2000 -w 200 >"$logf" 2>&1
    echo "- $name (rc=$?): $(awk '$1 == 8 && NF >= 13 {print $6 " / " $10 " us, #wrong " $9 + $13}' "$logf")" >>"$summary"
  done
}

stage_memory() {
  plugin_env
  table_header "peak memory of all_reduce_perf, $(shape_words), by kind of mapping (anon / gpu / shm / lib / file, MiB), P2P and SHM off"
  run mem-socket all_reduce_perf $(socket)
  run mem-socket4x4 all_reduce_perf $(socket_shape socket4x4)
  run mem-rxm all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm"
  local spec
  for spec in ${MEMORY_RUNS:-}; do
    # shellcheck disable=SC2046
    run "mem-rxm-${spec%%:*}" all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" $(echo "${spec#*:}" | tr , ' ')
  done
  run mem-shm all_reduce_perf $(fabric) NCCL_FABRIC_PROVIDER=shm
}

# MPS, so that two ranks on the one GPU run their kernels at once.
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  pgrep -f nvidia-cuda-mps-control >/dev/null || nvidia-cuda-mps-control -d
}

# hosts_run NAME TEST [VAR=VALUE ...]: TEST as two ranks, each a host of its own to NCCL
# (NCCL_HOSTID), on GPU 0, every byte over the network transport; CPU seconds of both ranks,
# peak RSS of the larger. $HOSTS_ENV (space-separated VAR=VALUE) goes to every run, Socket's
# too (NCCL_BUFFSIZE=8388608, say).
hosts_run() {
  local name=$1 test=$2
  shift 2
  local logf=$OUT/logs/$name.log cost=$OUT/logs/$name.cost start=$SECONDS
  log "run $name ($test, two hosts)"
  rm -f "$cost"
  python3 scripts/gpu/measure.py "$cost" timeout -k 10 "$TIMEOUT" \
    mpirun --allow-run-as-root ${HOSTS_BIND:---bind-to none} -np 2 \
    bash -c "$AS_HOST_SH" _ NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET ${HOSTS_ENV:-} "$@" \
    "$NCCL_TESTS_MPI_DIR/$test" -b "$MINBYTES" -e "$MAXBYTES" -f 2 -g 1 -n "$ITERS" -w "$WARMUP" \
    >"$logf" 2>&1 &
  local runner=$! rc
  # A run still going 10 s before its timeout: every thread's stack, for the record.
  ( sleep $((TIMEOUT - 10)); kill -0 $runner 2>/dev/null && stacks "$test" >"$OUT/logs/$name.stacks" 2>&1 ) &
  local watcher=$!
  wait $runner
  rc=$?
  kill $watcher 2>/dev/null
  row "$name" "$test" "$logf" $rc $((SECONDS - start)) "$(cat "$cost" 2>/dev/null)"
  # A killed rank can leave MPS refusing the next client ("busy or unavailable"): restart it.
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo quit | nvidia-cuda-mps-control 2>/dev/null
    sleep 3
    start_mps
  fi
}

# stacks NAME: each thread of each process called NAME: its name, kernel wait channel and,
# where gdb is installed, its stack.
stacks() {
  local pid tid
  for pid in $(pgrep -x "$1"); do
    echo "== pid $pid"
    for tid in /proc/"$pid"/task/*; do
      echo "$(basename "$tid") $(cat "$tid/comm") $(cat "$tid/wchan" 2>/dev/null)"
    done
    command -v gdb >/dev/null && timeout 20 gdb -batch -p "$pid" -ex 'thread apply all bt 12' 2>/dev/null \
      | grep -E '^(Thread|#)' | cut -c1-200
  done
}

stage_hosts() {
  plugin_env
  start_mps
  local fab=(NCCL_NET=Fabric NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so")
  local names=() v i=0 test=${HOSTS_TEST:-all_reduce_perf} tag=${HOSTS_TEST:+-${HOSTS_TEST%_perf}}${HOSTS_TAG:+-$HOSTS_TAG}
  table_header "Two ranks as two hosts on one GPU (MPS), mpirun ${HOSTS_BIND:---bind-to none}, $test -b $MINBYTES -e $MAXBYTES -f 2 -n $ITERS -w $WARMUP${HOSTS_ENV:+, $HOSTS_ENV}"
  local shape shapes=${HOSTS_SOCKETS-socket socket4x4 socket2x8}
  [ -n "${HOSTS_NO_SOCKET:-}" ] && shapes=
  for shape in $shapes; do
    # shellcheck disable=SC2046
    hosts_run "hosts$tag-$shape" "$test" $(socket_shape "$shape")
    names+=("hosts$tag-$shape")
  done
  hosts_run hosts$tag-fabric "$test" "${fab[@]}"
  names+=(hosts$tag-fabric)
  # Variants: ;-separated, each a space-separated list of VAR=VALUE ("none": no variant).
  IFS=';' read -ra variants <<<"${HOSTS_FABRIC_VARIANTS:-NCCL_FABRIC_DOMAINS=eth0}"
  [ "${HOSTS_FABRIC_VARIANTS:-}" = none ] && variants=()
  for v in "${variants[@]}"; do
    i=$((i + 1))
    local plugin=("${fab[@]}") label=$v
    # The word "baseline" in a variant runs the plugin in $BASELINE_DIR instead.
    if [[ " $v " == *" baseline "* ]]; then
      mkdir -p "$work/baseline"
      cp -f "$BASELINE_DIR/libnccl_net_fabric.so" "$work/baseline/libnccl-net-fabric.so"
      plugin=(NCCL_NET=Fabric NCCL_NET_PLUGIN="$work/baseline/libnccl-net-fabric.so")
      v=${v//baseline/}
    fi
    # shellcheck disable=SC2086
    hosts_run "hosts$tag-fabric-v$i" "$test" "${plugin[@]}" $v
    names+=("hosts$tag-fabric-v$i")
    echo "- hosts$tag-fabric-v$i: $label" >>"$summary"
  done
  {
    echo
    echo "The plugin's INFO lines (rank 0) and the NET devices NCCL's channels use:"
    echo '```'
    for n in "${names[@]}"; do
      grep -m3 -hE 'NET/Fabric.*(provider |sizing|CPUs|only loopback)' "$OUT/logs/$n.log" | sed "s/^/$n: /" | cut -c1-400
      echo "$n: channels $(grep -oE 'via NET/[A-Za-z]+/[0-9]+' "$OUT/logs/$n.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
    done
    echo '```'
    # With NCCL_FABRIC_TIMES=yes (in HOSTS_ENV or a variant): where each comm's requests spent
    # their time, as the comms said at close.
    for n in "${names[@]}"; do
      grep -hE 'NET/Fabric : (send|receive) comm .* requests, ' "$OUT/logs/$n.log" \
        | sed "s/.*NET\/Fabric : /- $n: /" | cut -c1-400
    done
    echo
    echo "Time per size (out-of-place, µs), side by side:"
    echo
    local logs=("${names[@]/#/$OUT/logs/}")
    python3 scripts/gpu/sizes.py "${logs[@]/%/.log}"
  } >>"$summary"
}

# Builds libfabric 2.1 with CUDA and ucx against the UCX in $UCX_TARBALL (cached) and sets
# UCX_ENV: what a process needs to load them (FI_UCX_DEVICES=eth0, UCX_TLS=tcp,cuda_copy,self).
ucx_setup() {
  local tarball=${UCX_TARBALL:-$in/ucx-1.19.0.tar.xz} ucx=$work/ucx
  lfu=$work/libfabric-ucx
  [ -f "$tarball" ] || { log "no UCX at $tarball"; return 1; }
  if [ ! -e "$lfu/lib/libfabric.so" ]; then
    rm -rf "$ucx"
    tar -xJf "$tarball" -C "$work" || return 1
    log "building libfabric 2.1 with CUDA and ucx"
    LIBFABRIC_PREFIX=$lfu LIBFABRIC_TARBALL=$LIBFABRIC_TARBALL \
      LIBFABRIC_CONFIGURE_EXTRA="--with-cuda=/usr/local/cuda --enable-cuda-dlopen --enable-ucx=$ucx" \
      bash scripts/build-libfabric.sh >"$OUT/logs/libfabric-ucx-build.log" 2>&1 \
      || { tail -n 40 "$OUT/logs/libfabric-ucx-build.log" >&2; return 1; }
  fi
  PLUGIN_LIB=$(install_plugin)
  UCX_NAME=$(basename "$tarball" .tar.xz)
  UCX_ENV=(LD_LIBRARY_PATH="$lfu/lib:$ucx/lib:${LD_LIBRARY_PATH:-}" UCX_MODULE_DIR="$ucx/lib/ucx"
    FI_UCX_DEVICES=eth0 UCX_TLS=${UCX_TLS:-tcp,cuda_copy,self})
}

stage_ucx() {
  ucx_setup || return 1
  {
    echo
    echo "## ucx (libfabric 2.1 with ucx, UCX $UCX_NAME)"
    echo '```'
    env "${UCX_ENV[@]}" timeout 60 "$lfu/bin/fi_info" -p ucx 2>&1 | head -n 20
    echo
    env "${UCX_ENV[@]}" NCCL_FABRIC_PROVIDER=ucx timeout 60 "$PLUGIN_DIR/nccl-net-fabric" doctor 2>&1 | head -n 60
    echo
    echo "With NCCL_NET_GDR_LEVEL=SYS:"
    env "${UCX_ENV[@]}" NCCL_FABRIC_PROVIDER=ucx NCCL_NET_GDR_LEVEL=SYS timeout 60 \
      "$PLUGIN_DIR/nccl-net-fabric" doctor 2>&1 | grep -E "GPU|GDR|handshake" | head -n 20
    echo '```'
  } >>"$summary"
}

# ucxhosts: two ranks as two hosts over ucx, -b $MINBYTES -e $MAXBYTES, for each test of
# $UCXHOSTS_TESTS (all_reduce_perf sendrecv_perf alltoall_perf): GPU buffers
# (NCCL_NET_GDR_LEVEL=SYS), host buffers (NCCL_FABRIC_HMEM=off) and Socket; all_reduce also
# without the GDR setting (the plugin's INFO line says why NCCL keeps host buffers). Then
# NCCL's GPU Direct RDMA lines, the channels' paths and the plugin's INFO lines per run.
stage_ucxhosts() {
  ucx_setup || return 1
  start_mps
  local fab=(NCCL_NET=Fabric NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so" "${UCX_ENV[@]}"
    NCCL_FABRIC_PROVIDER=ucx)
  local t short names=()
  table_header "ucx (UCX $UCX_NAME, FI_UCX_DEVICES=eth0, UCX_TLS=${UCX_TLS:-tcp,cuda_copy,self}), two ranks as two hosts on one GPU (MPS), -b $MINBYTES -e $MAXBYTES -f 2 -n $ITERS -w $WARMUP${HOSTS_ENV:+, $HOSTS_ENV}"
  for t in ${UCXHOSTS_TESTS:-all_reduce_perf sendrecv_perf alltoall_perf}; do
    short=${t%_perf}
    hosts_run "ucx-$short-gdr" "$t" "${fab[@]}" NCCL_NET_GDR_LEVEL=SYS
    names+=("ucx-$short-gdr")
    if [ "$short" = all_reduce ]; then
      hosts_run "ucx-$short-default" "$t" "${fab[@]}"
      names+=("ucx-$short-default")
    fi
    hosts_run "ucx-$short-host" "$t" "${fab[@]}" NCCL_FABRIC_HMEM=off
    hosts_run "ucx-$short-socket" "$t" NCCL_NET=Socket NCCL_NET_PLUGIN=none
    names+=("ucx-$short-host" "ucx-$short-socket")
  done
  {
    echo
    echo "NCCL's GPU Direct RDMA lines, the channels' paths and the plugin's INFO lines (rank 0):"
    echo '```'
    local n
    for n in "${names[@]}"; do
      grep -m2 -hoE 'GPU Direct RDMA (Enabled|Disabled)[^$]*' "$OUT/logs/$n.log" | sed "s/^/$n: /" | cut -c1-300
      grep -m5 -hE 'NET/Fabric.*(provider |handshake|NCCL passes|NCCL uses host|no progress threads)' "$OUT/logs/$n.log" | sed "s/^/$n: /" | cut -c1-500
      echo "$n: channels $(grep -oE 'via NET/[A-Za-z]+/[0-9]+(/GDRDMA)?' "$OUT/logs/$n.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
      grep -m3 -hE 'WARN|error|Segmentation' "$OUT/logs/$n.log" | sed "s/^/$n: /" | cut -c1-300
    done
    echo '```'
    echo
    echo "Time per size (out-of-place, µs), side by side:"
    echo
    local logs=("${names[@]/#/$OUT/logs/}")
    python3 scripts/gpu/sizes.py "${logs[@]/%/.log}"
  } >>"$summary"
}

# threads_cmd NAME: sets `cmd` to the 1 GiB all_reduce_perf run of the threads stage, two ranks
# as two hosts, for socket2x8, fabric or fabric-spin (progress threads that never sleep).
threads_cmd() {
  local how fab=(NCCL_NET=Fabric NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so")
  case $1 in
    # shellcheck disable=SC2207
    socket) how=($(socket)) ;;
    # shellcheck disable=SC2207
    socket2x8) how=($(socket_shape socket2x8)) ;;
    fabric) how=("${fab[@]}") ;;
    fabric-spin) how=("${fab[@]}" NCCL_FABRIC_PROGRESS_SPIN_US=10000000) ;;
    fabric-sleep50) how=("${fab[@]}" NCCL_FABRIC_PROGRESS_SPIN_US=50) ;;
  esac
  # shellcheck disable=SC2206
  cmd=(timeout -k 10 "$TIMEOUT" mpirun --allow-run-as-root ${THREADS_BIND:---bind-to none} -np 2
    bash -c "$AS_HOST_SH" _ NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "${how[@]}"
    "$NCCL_TESTS_MPI_DIR/all_reduce_perf" -b 1G -e 1G -g 1 -n "${THREADS_ITERS:-40}" -w 5)
}

# threads: where the CPU goes at 1 GiB, two ranks as two hosts, all_reduce_perf -b 1G -e 1G
# -n $THREADS_ITERS (40): CPU seconds by thread name (scripts/gpu/threads.py) for each of
# $THREADS_RUNS (default: Socket 2x8, the plugin as it sizes itself and with threads that never
# sleep; also known: socket, fabric-sleep50); where perf is installed (or comes in
# $PERF_TARBALL), a profile of each of $PERF_RUNS (socket2x8 fabric) by thread and shared
# object, and by thread and symbol. THREADS_BIND replaces mpirun's "--bind-to none"
# ("--bind-to core": one core per rank).
stage_threads() {
  plugin_env
  start_mps
  local name cmd
  for name in ${THREADS_RUNS:-socket2x8 fabric fabric-spin}; do
    log "threads $name"
    threads_cmd "$name"
    {
      echo
      echo "## CPU by thread: $name, all_reduce_perf 1 GiB x ${THREADS_ITERS:-40}, two ranks as two hosts, mpirun ${THREADS_BIND:---bind-to none}"
    } >>"$summary"
    python3 scripts/gpu/threads.py "$summary" "${cmd[@]}" >"$OUT/logs/threads-$name.log" 2>&1
    awk '$1 == 1073741824 && NF >= 13 {print "busbw at 1 GiB: " $8 " GB/s (out of place), " $12 " (in place)"}' \
      "$OUT/logs/threads-$name.log" >>"$summary"
  done
  perf_setup
  if command -v perf >/dev/null; then
    for name in ${PERF_RUNS:-socket2x8 fabric}; do
      log "perf over $name"
      threads_cmd "$name"
      # System-wide where the kernel lets us, else the run's processes and their children.
      # The run gets this script's library path back (a carried perf runs with its own).
      perf record -F 499 -a -g -o "$work/perf-$name.data" -- env LD_LIBRARY_PATH="$LD_LIBRARY_PATH" "${cmd[@]}" \
        >"$OUT/logs/perf-$name.log" 2>&1 \
        || perf record -F 499 -g -o "$work/perf-$name.data" -- env LD_LIBRARY_PATH="$LD_LIBRARY_PATH" "${cmd[@]}" \
          >>"$OUT/logs/perf-$name.log" 2>&1
      {
        echo
        echo "## perf, $name (all_reduce_perf 1 GiB, 499 Hz, mpirun ${THREADS_BIND:---bind-to none}): by thread and object, then by thread and symbol"
        awk '$1 == 1073741824 && NF >= 13 {print "busbw at 1 GiB: " $8 " GB/s"}' "$OUT/logs/perf-$name.log"
        echo '```'
        perf report -i "$work/perf-$name.data" --no-children --sort comm,dso --stdio 2>&1 | grep -v '^#' | grep -v '^$' | head -n 30
        echo
        perf report -i "$work/perf-$name.data" --no-children --sort comm,sym --stdio -g none 2>&1 | grep -v '^#' | grep -v '^$' | head -n 60
        echo '```'
      } >>"$summary"
    done
  else
    echo "- perf: not installed on this machine" >>"$summary"
  fi
}

# tool_setup TOOL TARBALL: TOOL from TARBALL (the binary in bin/ and the libraries it needs in
# lib/, made on the Debian build machine by scripts/gpu/prepare.sh) where this machine has none.
tool_setup() {
  command -v "$1" >/dev/null && return 0
  [ -f "$2" ] || return 0
  local d=$work/$1
  [ -x "$d/bin/$1" ] || { mkdir -p "$d" && tar -C "$d" --strip-components=1 -xJf "$2"; }
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/%s "$@"\n' "$d" "$d" "$1" >"$d/$1"
  chmod +x "$d/$1"
  export PATH=$d:$PATH
  "$1" -V >/dev/null 2>&1 || "$1" --version >/dev/null 2>&1 || log "$1 from $2 does not run here"
}

perf_setup() {
  tool_setup perf "$PERF_TARBALL"
}

# steps: where the time of NCCL's network steps goes, by NCCL's example profiler plugin (built
# here from $NCCL_PROFILER_TARBALL, a copy of ext-profiler/example of NCCL's source kept out of
# this repository): all_reduce_perf at each of $STEPS_SIZES, two ranks as two hosts, for Socket as
# shipped, 2x8, the plugin with no setting and each of $STEPS_VARIANTS (;-separated VAR=VALUE
# lists); scripts/gpu/steps.py reads the traces.
stage_steps() {
  plugin_env
  start_mps
  local prof=$work/nccl-profiler size name i v
  if [ ! -f "$prof/libnccl-profiler-example.so" ]; then
    [ -f "$NCCL_PROFILER_TARBALL" ] || { log "no profiler source ($NCCL_PROFILER_TARBALL)"; return 1; }
    mkdir -p "$prof" && tar -C "$prof" --strip-components=1 -xJf "$NCCL_PROFILER_TARBALL"
    (cd "$prof" && g++ -O2 -Inccl -I/usr/local/cuda/include -fPIC -shared -o libnccl-profiler-example.so ./*.cc) \
      >"$OUT/logs/profiler-build.log" 2>&1 || { tail -n 20 "$OUT/logs/profiler-build.log" >&2; return 1; }
  fi
  # 16 collectives of each kind kept: the 12 + 3 of a run (a collective record is 755 MB of
  # address space, touched only where steps are written).
  local pools=(NCCL_PROFILE_GROUP_API_POOL_SIZE=16 NCCL_PROFILE_COLL_API_POOL_SIZE=16
    NCCL_PROFILE_KERNEL_LAUNCH_POOL_SIZE=16 NCCL_PROFILE_GROUP_POOL_SIZE=16
    NCCL_PROFILE_COLL_POOL_SIZE=16 NCCL_PROFILE_P2P_POOL_SIZE=4 NCCL_PROFILE_P2P_API_POOL_SIZE=4)
  local runs=("socket|$(socket_shape socket)" "socket2x8|$(socket_shape socket2x8)"
    "fabric|NCCL_NET=Fabric NCCL_NET_PLUGIN=$PLUGIN_LIB/libnccl-net-fabric.so")
  IFS=';' read -ra variants <<<"${STEPS_VARIANTS:-}"
  i=0
  for v in "${variants[@]}"; do
    i=$((i + 1))
    runs+=("fabric-v$i|NCCL_NET=Fabric NCCL_NET_PLUGIN=$PLUGIN_LIB/libnccl-net-fabric.so $v")
  done
  table_header "Steps profiled (NCCL's example profiler), two ranks as two hosts, ${STEPS_TEST:-all_reduce_perf} -n 12 -w 3${HOSTS_ENV:+, $HOSTS_ENV}"
  local rows=()
  for size in ${STEPS_SIZES:-8 1M 256M}; do
    for v in "${runs[@]}"; do
      name=${v%%|*}
      local dump=$work/steps/$name-$size
      mkdir -p "$work/steps" && rm -f "$dump"_*.json
      # shellcheck disable=SC2086
      MINBYTES=$size MAXBYTES=$size ITERS=12 WARMUP=3 hosts_run "steps-$name-$size" "${STEPS_TEST:-all_reduce_perf}" \
        ${v#*|} NCCL_PROFILER_PLUGIN="$prof/libnccl-profiler-example.so" NCCL_PROFILE_EVENT_MASK=16 \
        NCCL_PROFILE_DUMP_FILE="$dump" "${pools[@]}"
      rows+=("$(python3 scripts/gpu/steps.py "$name $size ($(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {print $6 " µs"}' "$OUT/logs/steps-$name-$size.log" | head -1))" "$dump")")
      # Keep the traces, compressed, for a closer look.
      tar -C "$work/steps" -cJf "$OUT/logs/steps-$name-$size.tar.xz" $(cd "$work/steps" && ls "$name-$size"_*.json 2>/dev/null) 2>/dev/null
    done
  done
  for i in "${variants[@]}"; do echo "- variant: $i" >>"$summary"; done
  {
    echo
    echo "Where each step's time goes (median time of the phase / steps in that phase on average while the operation ran):"
    echo
    python3 scripts/gpu/steps.py --header
    printf '%s\n' "${rows[@]}"
  } >>"$summary"
}

stage_capped() {
  local rate=${CAP_RATE:-2gbit} watcher
  tool_setup tc "$in/tc.tar.xz"
  tc qdisc del dev lo root 2>/dev/null
  if ! { tc qdisc add dev lo root handle 1: htb default 1 \
    && tc class add dev lo parent 1: classid 1:1 htb rate 400gbit quantum 65536; } 2>"$OUT/logs/capped-tc.log"; then
    echo "- capped: skipped (an HTB qdisc on lo refused: $(head -c 200 "$OUT/logs/capped-tc.log"))" >>"$summary"
    return 1
  fi
  python3 scripts/gpu/capflows.py lo "$rate" 3600 >>"$OUT/logs/capped-tc.log" 2>&1 &
  watcher=$!
  HOSTS_TEST=${CAPPED_TEST:-all_reduce_perf} HOSTS_TAG=capped HOSTS_ENV="${HOSTS_ENV:-}" \
    HOSTS_FABRIC_VARIANTS=${HOSTS_FABRIC_VARIANTS:-none} stage_hosts
  kill $watcher 2>/dev/null
  echo "- capped: every TCP connection on lo at most $rate (an HTB class each, made within 100 ms of its start by scripts/gpu/capflows.py); $(tc class show dev lo | grep -c 'class htb') classes" >>"$summary"
  tc qdisc del dev lo root 2>>"$OUT/logs/capped-tc.log"
}

stage_scale() {
  local dir=${SCALE_DIR:-$in/scale} n
  [ -x "$dir/scale" ] || { log "no scale test in $dir"; return 1; }
  tool_setup ip "${IP_TARBALL:-$in/ip.tar.xz}"
  for n in ${SCALE_HOSTS:-16 8}; do
    LD_LIBRARY_PATH=$lf/lib NFAB_SCALE_HOSTS=$n timeout "$TIMEOUT" "$dir/scale" --exact \
      many_hosts_connect_all_to_all_and_survive_a_killed_host_and_a_cut_link --nocapture \
      >"$OUT/logs/scale$n.log" 2>&1
    echo "- scale, $n hosts: rc $? $(grep -E '^(tcp|SKIPPED)' "$OUT/logs/scale$n.log" | cut -c1-300 | tr '\n' ' ')" >>"$summary"
  done
}

stage_targets() {
  local part budget=${TARGETS_BUDGET:-540}
  for part in ${TARGETS_PARTS:-allreduce sendrecv alltoall bound torch}; do
    if [ "$SECONDS" -ge "$budget" ]; then
      echo "- targets: $part not run (${SECONDS}s of the ${budget}s budget used)" >>"$summary"
      continue
    fi
    log "targets: $part"
    case $part in
      allreduce) MINBYTES=8 MAXBYTES=1G stage_hosts ;;
      sendrecv | alltoall)
        MINBYTES=8 MAXBYTES=256M HOSTS_TEST=${part}_perf HOSTS_FABRIC_VARIANTS=none stage_hosts ;;
      # On one core a progress thread that sleeps may be worth it where one that spins is not.
      bound) MINBYTES=1M MAXBYTES=1G HOSTS_BIND="--bind-to core" HOSTS_TAG=bound \
        HOSTS_FABRIC_VARIANTS="NCCL_FABRIC_PROGRESS_THREAD=yes" stage_hosts ;;
      torch) stage_torchhosts ;;
      *) log "targets: no part $part" ;;
    esac
  done
}

# conform: `nccl-net-fabric conform` over ucx (GPU rows included) with libfabric built with
# ucx, and over $CONFORM_PROVIDERS with the libfabric stage's build where it is there; the
# text reports in the summary.
stage_conform() {
  ucx_setup || return 1
  {
    echo
    echo "## conform over ucx (UCX $UCX_NAME, ${UCX_ENV[*]:2})"
    echo '```'
    env "${UCX_ENV[@]}" timeout 240 "$PLUGIN_DIR/nccl-net-fabric" conform --provider ucx \
      --plugin "$PLUGIN_LIB/libnccl-net-fabric.so" 2>&1
    echo "exit $?"
    echo '```'
  } >>"$summary"
  local p
  for p in ${CONFORM_PROVIDERS:-}; do
    [ -e "$lf/lib/libfabric.so" ] || break
    {
      echo
      echo "## conform over $p (libfabric with CUDA)"
      echo '```'
      LD_LIBRARY_PATH=$lf/lib:${LD_LIBRARY_PATH:-} NCCL_FABRIC_DOMAINS=eth0,shm timeout 240 \
        "$PLUGIN_DIR/nccl-net-fabric" conform --provider "$p" --plugin "$PLUGIN_LIB/libnccl-net-fabric.so" 2>&1
      echo "exit $?"
      echo '```'
    } >>"$summary"
  done
}

stage_fabtests() {
  local ft=$work/fabtests
  if [ -x "$ft/bin/fi_rdm_tagged_bw" ]; then return 0; fi
  local src=$work/fabtests-src
  # A libfabric unpacked from an older builds.tar.xz has no headers: build it here first.
  if [ ! -f "$lf/include/rdma/fabric.h" ]; then
    rm -rf "$lf"
    stage_libfabric || return 1
  fi
  rm -rf "$src"; mkdir -p "$src"
  tar -xJf "$LIBFABRIC_TARBALL" -C "$src" --strip-components=1 || return 1
  [ -x "$src/fabtests/configure" ] || { log "no configure in fabtests (run scripts/gpu/prepare.sh again)"; return 1; }
  log "building fabtests"
  (cd "$src/fabtests" && ./configure --prefix="$ft" --with-libfabric="$lf" >"$OUT/logs/fabtests-build.log" 2>&1 \
    && make -j"$(nproc)" install >>"$OUT/logs/fabtests-build.log" 2>&1) \
    || { tail -n 30 "$OUT/logs/fabtests-build.log" >&2; return 1; }
}

# eth0's IPv4 address (SIOCGIFADDR; the machine may have no iproute2).
eth0_ip() {
  python3 -c 'import fcntl, socket, struct; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); print(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", b"eth0"))[20:24]))'
}

# fabtests_program DIR bw|pingpong OP: the fabtests program in DIR and its arguments for an
# operation: "tagged" messages (what the plugin posts; rxm sends a long one by rendezvous) or
# "writedata", RMA writes with remote CQ data (the data goes at once into a buffer the
# receiver announced, and the sender's completion needs no answer from the receiver).
fabtests_program() {
  case $2-$3 in
    bw-tagged) echo "$1/fi_rdm_tagged_bw" ;;
    bw-writedata) echo "$1/fi_rma_bw -e rdm -o writedata" ;;
    pingpong-tagged) echo "$1/fi_rdm_tagged_pingpong" ;;
    pingpong-writedata) echo "$1/fi_rma_pingpong -o writedata" ;;
    *) log "unknown fabtests operation $3 (tagged, writedata)"; return 1 ;;
  esac
}

stage_ceiling() {
  stage_fabtests || return 1
  local prov=${CEILING_PROVIDER:-tcp;ofi_rxm} ip n k port op size window prog=() tag
  ip=$(eth0_ip)
  {
    echo
    echo "## What $prov itself moves here (fabtests, both directions at once, over $ip)"
    echo
    echo "| operation | message bytes | in flight per flow | flows each way | MB/s one way (sum) | MB/s the other way (sum) | both, GB/s |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
  } >>"$summary"
  # Pair K of the run in the loops below: ceiling_pair K (-s ADDRESS for its server | ADDRESS).
  ceiling_pair() {
    env LD_LIBRARY_PATH="$lf/lib" timeout 60 "${prog[@]}" -p "$prov" -E="$((port + $1))" \
      -S "$size" -W "$window" -I "$iters" -w $((iters / 30 + 1)) "${@:2}"
  }
  port=23000
  for op in ${CEILING_OPS:-tagged}; do
    read -ra prog <<<"$(fabtests_program "$work/fabtests/bin" bw "$op")" && [ ${#prog[@]} -gt 0 ] || return 1
    for size in ${CEILING_SIZE:-1048576}; do
      for window in ${CEILING_WINDOW:-64}; do
        for n in ${CEILING_FLOWS:-1 2 4}; do
          local pids=() iters=${CEILING_ITERS:-$((3221225472 / size))}
          [ "$iters" -ge 20 ] || iters=20
          tag=$op-$size-$window-$n
          # 2n pairs: n servers of each direction; on one machine a direction is only which
          # of the pair sends, so pair k of direction d is server d, client 1-d.
          for k in $(seq 0 $((2 * n - 1))); do
            ceiling_pair "$k" -s "$ip" >"$OUT/logs/ceiling-$tag-$k-server.log" 2>&1 &
            pids+=($!)
          done
          sleep 1
          for k in $(seq 0 $((2 * n - 1))); do
            ceiling_pair "$k" "$ip" >"$OUT/logs/ceiling-$tag-$k-client.log" 2>&1 &
            pids+=($!)
          done
          wait "${pids[@]}"
          port=$((port + 2 * n))
          # The MB/sec column of each client's result line.
          local sums
          sums=$(for k in $(seq 0 $((2 * n - 1))); do
            awk '/^[0-9]/ && NF >= 7 {v = $5} END {print v + 0}' "$OUT/logs/ceiling-$tag-$k-client.log"
          done | awk -v n="$n" '{ if (NR <= n) a += $1; else b += $1 } END { printf "%.0f | %.0f | %.2f", a, b, (a + b) / 1000 }')
          echo "| $op | $size | $window | $n | $sums |" >>"$summary"
        done
      done
    done
  done
}

# pingpong: one small message's one-way time, the floor under NCCL's 8-byte steps: a plain TCP
# socket polled as NCCL's Socket transport polls it (scripts/gpu/tcp_pingpong.c, built here)
# and fabtests fi_rdm_tagged_pingpong over each of $PINGPONG_PROVIDERS (tcp;ofi_rxm tcp), over
# eth0's address, $PINGPONG_SIZES bytes (8 4096), 20000 round trips. fabtests comes from
# $FABTESTS_BIN (default .scratch/gpu-in/fabtests, built on the build machine) or the
# fabtests stage.
stage_pingpong() {
  local bin=${FABTESTS_BIN:-$in/fabtests} ip size prov op port=24100 name cols=()
  [ -x "$bin/fi_rdm_tagged_pingpong" ] || { stage_fabtests && bin=$work/fabtests/bin; } || return 1
  cc -O2 -o "$work/tcp_pingpong" scripts/gpu/tcp_pingpong.c || return 1
  ip=$(eth0_ip)
  for op in ${PINGPONG_OPS:-tagged}; do
    fabtests_program "$bin" pingpong "$op" >/dev/null || return 1
    for prov in ${PINGPONG_PROVIDERS:-tcp;ofi_rxm tcp}; do
      case $op in tagged) cols+=("$prov") ;; *) cols+=("$prov $op") ;; esac
    done
  done
  {
    echo
    echo "## One message's one-way time over $ip (20000 round trips, µs)"
    echo
    echo "| bytes | TCP socket, polled |$(printf ' %s |' "${cols[@]}")"
    echo "| --- | --- |$(printf ' --- |%.0s' "${cols[@]}")"
  } >>"$summary"
  for size in ${PINGPONG_SIZES:-8 4096}; do
    port=$((port + 1))
    local row="| $size | $(timeout 60 "$work/tcp_pingpong" "$ip" "$port" "$size" 20000 | awk '{print $4}') |"
    for op in ${PINGPONG_OPS:-tagged}; do
      local pp=()
      read -ra pp <<<"$(fabtests_program "$bin" pingpong "$op")"
      for prov in ${PINGPONG_PROVIDERS:-tcp;ofi_rxm tcp}; do
        port=$((port + 1))
        name=$size-${prov//;/_}-$op
        local cmd=(env LD_LIBRARY_PATH="$lf/lib" timeout 60 "${pp[@]}" -p "$prov" -E="$port" -S "$size" -I 20000)
        "${cmd[@]}" -s "$ip" >"$OUT/logs/pingpong-$name-server.log" 2>&1 &
        sleep 1
        "${cmd[@]}" "$ip" >"$OUT/logs/pingpong-$name-client.log" 2>&1
        wait
        # The usec/xfer column: one way.
        row+=" $(awk '$1 ~ /^[0-9]+[kmg]?$/ && NF >= 7 {v = $6} END {print v}' "$OUT/logs/pingpong-$name-client.log") |"
      done
    done
    echo "$row" >>"$summary"
  done
}

stage_pack() {
  tar -cJf "$OUT/builds.tar.xz" -C "$work" libfabric-cuda/lib libfabric-cuda/bin libfabric-cuda/include \
    nccl-tests/{all_reduce,sendrecv,alltoall}_perf nccl-tests-mpi/{all_reduce,sendrecv,alltoall}_perf 2>/dev/null
  log "packed $(du -h "$OUT/builds.tar.xz" | cut -f1)"
}

stage_torch() {
  plugin_env
  local logf=$OUT/logs/torch.log
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Fabric NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    NCCL_NET_PLUGIN="$PLUGIN_LIB/libnccl-net-fabric.so" NCCL_FABRIC_PROVIDER="tcp;ofi_rxm" ROUNDS=3 \
    timeout -k 10 "$TIMEOUT" torchrun --standalone --nproc_per_node 2 scripts/gpu/torch_allreduce.py \
    >"$logf" 2>&1
  local rc=$?
  {
    echo
    echo "## PyTorch (torchrun, 2 processes, tcp;ofi_rxm, 3 process groups one after another)"
    echo
    echo "- rc=$rc, $(grep -o 'RESULT torch_allreduce=[a-z]*' "$logf" | head -1), $(grep -c 'via NET/Fabric' "$logf") channels via NET/Fabric, $(grep -c 'Loaded net plugin Fabric' "$logf") plugin loads"
    grep -h '^round' "$logf" | sed 's/^/- /'
  } >>"$summary"
}

[ $# -gt 0 ] || { awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2; }
{
  echo "# nccl-net-fabric on a GPU machine, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "NCCL $(python3 -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null), torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null), libfabric 2.1.0 (built here with CUDA), $(nvidia-smi -L | wc -l) GPUs; nccl-tests -b 1M -e 1G -f 4 -n $ITERS -w $WARMUP"
} >>"$summary"
[ "$*" = all ] && set -- libfabric nccltests doctor loading collectives variants mpi torch
[ "$*" = issue10 ] && set -- libfabric nccltests compare torch loading
for stage in "$@"; do
  log "stage $stage"
  "stage_$stage" || log "stage $stage failed"
done
log "done: $summary"
