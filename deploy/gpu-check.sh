#!/usr/bin/env bash
# The one command for the GPU machine (the `device` tool's `run`): builds the
# CUDA backend for Hopper (sm_90a), runs the gpu ctest suites, then the GPU
# throughput benchmark (`shardline bench --device cuda:0`, dummy BF16 weights,
# BF16 KV, vLLM's setting 1000 x 256 in / 256 out) and the plain PyTorch
# reference (bench/torch_reference.py) for llama-3.1-8b and qwen3-8b, within
# one time budget (the tool stops a command at 10 minutes).
#
#   bash deploy/gpu-check.sh [run] [options]     on the GPU machine (default)
#   bash deploy/gpu-check.sh pack [--prebuilt BUILD_DIR]
#                                                here, before the device call; BUILD_DIR:
#     cmake -S . -B build-prebuilt -G Ninja -DCMAKE_BUILD_TYPE=Release \
#       -DSHARDLINE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DSHARDLINE_NATIVE=OFF
#     ninja -C build-prebuilt shardline <every *_gpu_test target>
#   bash deploy/gpu-check.sh run --dry-run       print the plan, run nothing
#
# Why `pack`: the GPU machine has CUDA 13, cmake, ninja and python3 + torch;
# the device tool's KINDS.md lists none of Shardline's Debian build
# dependencies (nlohmann-json, CLI11, OpenBLAS, sentencepiece, PCRE2,
# utf8proc, OpenSSL headers, GoogleTest, CAF, Cap'n Proto, RocksDB, spdlog,
# cpp-httplib), and it cannot reach a package registry. `pack` copies the
# files of those packages (and the runtime libraries they link that a base
# image may lack) from this machine (Debian 12, where deploy/install-deps.sh
# installed them; the GPU machine needs glibc >= 2.36) into
# .gpucheck/deps.tar.gz, 27 MB (.gpucheck/ is added to .git/info/exclude).
# Carry it with the call (`carry: [".gpucheck"]`); `run` unpacks it into /
# without replacing any file that is already there (tar --skip-old-files
# --keep-directory-symlink), so the machine's own libraries win. Checked here
# in a mount namespace with those packages' files removed from /usr: unpack,
# configure, build and load all work. With --prebuilt BUILD_DIR, `pack` also
# bundles that (CUDA, sm_90a) build's `shardline` and gpu test executables,
# which `run` uses (see below).
#
# The device call (timeout_s 600):
#   set -o pipefail; bash deploy/gpu-check.sh           (writes its log to $OUT itself)
# with carry [".gpucheck"]. Files back in $OUT (at most 8): log, summary.json,
# bench-<model>.json, torch-<model>.json.
#
# Shapes: --shared DIR (default ../shared beside the checkout, which the device
# tool does not carry; else .gpucheck/shared, which `pack` copies from it)
# holds models/shapes/<model>/config.json; where neither has a shape, the
# copies in bench/shapes/<model>/ are used.
#
# What the first real run found (2026-11-28, one H200, Ubuntu 24.04, glibc
# 2.39, g++ 13.3, CUDA 13.0, driver 580.159.04):
#  * a build there fails: Debian's Cap'n Proto 0.9.2 headers do not compile
#    with g++ 13 in C++20 (capnp/blob.h: no operator== for const char* and
#    kj::StringPtr). So `run` uses the prebuilt binaries whenever
#    .gpucheck/prebuilt.tar.gz is there (`--build` builds anyway);
#  * the machine has libraries of its own under the same sonames (Ubuntu's
#    libsentencepiece.so.0), which --skip-old-files keeps and which crashed
#    the prebuilt binaries (SentencePieceProcessor::Normalize, another ABI).
#    So the packed libraries are also unpacked into a private prefix
#    ($BUILD-deps) that the prebuilt binaries load first (LD_LIBRARY_PATH).
# Measured there: unpack 9 s, gpu tests 16 s, per model: bench 22-31 s
# (setup 7-8 s; 1000 prompts), torch reference 24-28 s; machine start about
# 30-60 s of device time before the command runs. Every step checks the
# budget (--budget, default 560 s) first and is skipped when too little is
# left, and each runs under `timeout`. Steps run in priority order: build,
# gpu tests, llama bench, qwen3 bench, the group stage (the gpu tests of
# engine groups sharing GPU 0, then llama's bench on --group-parallel,
# default tp=2, beside its single-GPU run), llama torch, qwen3 torch. Smaller
# runs: --num-prompts, --num-layers, --models, --no-tests, --no-torch,
# --quick; torch alone (no build): --no-tests --no-bench.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 1

# ---- options -------------------------------------------------------------------
MODE=run
OUT_DIR="${OUT:-$REPO/out/gpu-check}"
SHARED="$REPO/../shared"
BUILD="$REPO/build-gpu"
JOBS="$(nproc 2>/dev/null || echo 8)"
TEST_JOBS=4
BUDGET=560
MODELS="llama-3.1-8b qwen3-8b"
NUM_PROMPTS=1000
INPUT_LEN=256
OUTPUT_LEN=256
MAX_BATCH=256
MAX_TOKENS=8192
NUM_LAYERS=0
GPU_UTIL=0.9
BENCH_ARGS=""
TORCH_ARGS="--cuda-graph"  # torch_reference.py falls back to eager by itself if capture fails
DO_BUILD=1
DO_TESTS=1
DO_BENCH=1
DO_TORCH=1
DO_GROUP=1
GROUP_PARALLEL="tp=2"   # the group stage's bench: ranks sharing GPU 0 (issue 41)
# gtest filter of the group stage's gpu tests (engine groups of ranks sharing GPU 0)
GROUP_TESTS="*SharingCuda0*:*SeesawJob*:*ShiftJob*:*SidpJob*"
FORCE_PREBUILT=0
FORCE_BUILD=0
DRY_RUN=0
PACK_DIR="$REPO/.gpucheck"
PREBUILT_SRC=""

usage() {
  sed -n '2,/^set -uo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  cat <<EOF
Options of run:
  --out DIR                    where the log and JSON go (default: \$OUT, else out/gpu-check)
  --shared DIR                 shared/ folder (default ../shared, else .gpucheck/shared;
                               shapes fall back to bench/shapes)
  --build-dir DIR              (default build-gpu)
  --jobs N                     build jobs (default nproc)
  --test-jobs N                gpu test processes at a time (default 4)
  --budget SECONDS             the whole run, start to summary (default 560)
  --models "A B"               shape names (default "llama-3.1-8b qwen3-8b")
  --num-prompts N              (default 1000)
  --input-len N / --output-len N   (default 256 / 256)
  --max-batch N                running sequences (default 256)
  --max-num-batched-tokens N   tokens per step (default 8192)
  --num-layers N               first N layers only (default 0: all)
  --gpu-memory-utilization F   (default 0.9)
  --bench-args "..."           more flags for shardline bench (e.g. "--enforce-eager")
  --torch-args "..."           flags for torch_reference.py (default "--cuda-graph"; "" = eager)
  --no-build                   use the build dir as it is
  --no-tests / --no-bench / --no-torch
  --no-group                   skip the group stage (its gpu tests and its bench)
  --group-parallel CONFIG      the group bench's engine group on GPU 0 (default tp=2)
  --prebuilt                   use .gpucheck/prebuilt.tar.gz (the default when it is there)
  --build                      build on the machine even when a prebuilt bundle is there
  --quick                      smoke run: 200 prompts, no torch reference
  --dry-run                    print what would run
Options of pack:
  --prebuilt BUILD_DIR         also bundle BUILD_DIR's shardline and gpu tests
EOF
}

if [[ $# -gt 0 && ( "$1" == run || "$1" == pack ) ]]; then MODE="$1"; shift; fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT_DIR="$2"; shift 2 ;;
    --shared) SHARED="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --test-jobs) TEST_JOBS="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --num-prompts) NUM_PROMPTS="$2"; shift 2 ;;
    --input-len) INPUT_LEN="$2"; shift 2 ;;
    --output-len) OUTPUT_LEN="$2"; shift 2 ;;
    --max-batch) MAX_BATCH="$2"; shift 2 ;;
    --max-num-batched-tokens) MAX_TOKENS="$2"; shift 2 ;;
    --num-layers) NUM_LAYERS="$2"; shift 2 ;;
    --gpu-memory-utilization) GPU_UTIL="$2"; shift 2 ;;
    --bench-args) BENCH_ARGS="$2"; shift 2 ;;
    --torch-args) TORCH_ARGS="$2"; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    --build) FORCE_BUILD=1; shift ;;
    --no-tests) DO_TESTS=0; shift ;;
    --no-bench) DO_BENCH=0; shift ;;
    --no-torch) DO_TORCH=0; shift ;;
    --no-group) DO_GROUP=0; shift ;;
    --group-parallel) GROUP_PARALLEL="$2"; shift 2 ;;
    --quick) NUM_PROMPTS=200; DO_TORCH=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --prebuilt)
      if [[ "$MODE" == pack ]]; then PREBUILT_SRC="$2"; shift 2; else FORCE_PREBUILT=1; shift; fi ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done

# The gpu ctest executables: tests/**/NAME_gpu_test.cpp -> target DIR_NAME_gpu_test
# (the naming of tests/CMakeLists.txt).
gpu_test_targets() {
  (cd "$REPO/tests" && find . -name '*_gpu_test.cpp' | sort | sed 's|^\./||; s|\.cpp$||; s|/|_|g')
}

# =============================== pack (dev machine) ================================
# Debian packages whose files the build needs: deploy/install-deps.sh's
# libraries, the -dev packages their CMake configs look for (RocksDB:
# gflags, snappy, zlib, bzip2, lz4, zstd; Cap'n Proto: pkg-config), and the
# runtime libraries they link beyond libc, libstdc++, libgcc and zlib (found
# with ldd below).
DEV_PACKAGES=(
  libcaf-dev libcaf-core0.17 libcaf-io0.17 libcaf-openssl0.17
  capnproto libcapnp-dev libcapnp-0.9.2
  librocksdb-dev librocksdb7.8
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread
  libsentencepiece-dev libsentencepiece0
  nlohmann-json3-dev libcli11-dev
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libssl-dev libssl3
  libcpp-httplib-dev libcpp-httplib0.11
  libutf8proc-dev libutf8proc2
  libgtest-dev libgmock-dev
  libgflags-dev libsnappy-dev zlib1g-dev libbz2-dev libbz2-1.0 liblz4-dev libzstd-dev libbrotli-dev
  pkg-config pkgconf pkgconf-bin libpkgconf3
)
SKIP_RUNTIME="^(libc6|libstdc\+\+6|libgcc-s1|zlib1g)$"

pack() {
  command -v dpkg-query >/dev/null || { echo "pack: needs a Debian machine with deploy/install-deps.sh run" >&2; exit 1; }
  local p missing=()
  for p in "${DEV_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "pack: not installed here: ${missing[*]} (run deploy/install-deps.sh)" >&2; exit 1
  fi
  # Runtime closure: packages of the libraries the shared objects and tools link.
  local pkgs=("${DEV_PACKAGES[@]}") extra
  extra=$(for p in "${DEV_PACKAGES[@]}"; do dpkg -L "$p"; done | grep -E '\.so(\.[0-9.]+)?$|/bin/' |
            while read -r f; do [[ -f "$f" ]] && ldd "$f" 2>/dev/null | awk '/=>/ {print $3}'; done | sort -u |
            while read -r l; do dpkg -S "$(readlink -f "$l")" 2>/dev/null | cut -d: -f1; done | sort -u |
            grep -Ev "$SKIP_RUNTIME" || true)
  for p in $extra; do [[ " ${pkgs[*]} " == *" $p "* ]] || pkgs+=("$p"); done
  echo "pack: ${#pkgs[@]} packages: ${pkgs[*]}"

  local stage; stage="$(mktemp -d)"
  trap 'rm -rf "$stage"' RETURN
  local f rel
  for p in "${pkgs[@]}"; do
    while read -r f; do
      [[ -f "$f" || -L "$f" ]] || continue
      case "$f" in
        /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*|/usr/share/bug/*|/etc/*) continue ;;
        *.a)  # Static libraries: the real ones for GoogleTest only. CMake export files
              # (RocksDB, gflags, ...) name their static targets too and check that the
              # files exist; we link the shared ones, so an empty archive stands in.
          if [[ ! "$f" =~ /lib(gtest|gtest_main|gmock|gmock_main)\.a$ ]]; then
            rel="${f#/}"; case "$rel" in lib/*) rel="usr/$rel" ;; esac
            mkdir -p "$stage/$(dirname "$rel")" && printf '!<arch>\n' >"$stage/$rel"
            continue
          fi ;;
        */liblapack.so*|*/libblas.so*) continue ;;  # OpenBLAS' LAPACK/BLAS copies: unused
      esac
      rel="${f#/}"
      # Merged /usr on both ends: keep every path under usr/ (never a real lib/ or bin/ over /'s symlinks).
      case "$rel" in lib/*|lib64/*|bin/*|sbin/*) rel="usr/$rel" ;; esac
      mkdir -p "$stage/$(dirname "$rel")"
      cp -P "$f" "$stage/$rel"
    done < <(dpkg -L "$p")
  done
  # Debian's update-alternatives links for OpenBLAS (made by postinst, not in dpkg -L).
  for f in /usr/lib/x86_64-linux-gnu/libopenblas.so /usr/lib/x86_64-linux-gnu/libopenblas.so.0; do
    [[ -e "$f" ]] || continue
    rm -f "$stage/${f#/}"
    ln -s "$(realpath --relative-to="$(dirname "$f")" "$(readlink -f "$f")")" "$stage/${f#/}"
  done
  mkdir -p "$PACK_DIR"
  {
    echo "packed $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
    for p in "${pkgs[@]}"; do dpkg-query -W -f='${Package} ${Version}\n' "$p"; done
  } >"$stage/usr/share/shardline-gpucheck-deps.txt"
  tar -C "$stage" --owner=0 --group=0 -czf "$PACK_DIR/deps.tar.gz" usr
  echo "pack: $PACK_DIR/deps.tar.gz $(du -h "$PACK_DIR/deps.tar.gz" | cut -f1) ($(du -sh "$stage" | cut -f1) unpacked)"

  if [[ -n "$PREBUILT_SRC" ]]; then
    local b="$PREBUILT_SRC" pre; pre="$(mktemp -d)"
    [[ -x "$b/cli/shardline" ]] || { echo "pack: $b/cli/shardline not built" >&2; exit 1; }
    grep -q 'code=.*sm_90a' "$b/build.ninja" ||
      { echo "pack: $b is not a CUDA build for sm_90a (CMAKE_CUDA_ARCHITECTURES=90a, Ninja)" >&2; exit 1; }
    # -march=native would tie the binaries to this machine's processor.
    grep -q '^SHARDLINE_NATIVE:BOOL=OFF' "$b/CMakeCache.txt" ||
      { echo "pack: configure $b with -DSHARDLINE_NATIVE=OFF (the GPU machine's processor differs)" >&2; exit 1; }
    mkdir -p "$pre/bin" "$pre/tests"
    strip -o "$pre/bin/shardline" "$b/cli/shardline"
    local t n=0
    for t in $(gpu_test_targets); do
      if [[ -x "$b/tests/$t" ]]; then strip -o "$pre/tests/$t" "$b/tests/$t"; n=$((n + 1));
      else echo "pack: warning: $b/tests/$t not built (ninja -C $b $t)"; fi
    done
    {
      echo "built from $(grep '^CMAKE_HOME_DIRECTORY:' "$b/CMakeCache.txt" | cut -d= -f2) at commit $(git -C "$REPO" rev-parse --short HEAD)"
      echo "working tree diff sha1 $(git -C "$REPO" diff HEAD | sha1sum | cut -c1-12), packed $(date -u +%FT%TZ)"
      echo "binary dir $(cd "$b" && pwd)"
      grep -E '^(SHARDLINE_SHARED_DIR|SHARDLINE_NATIVE):' "$b/CMakeCache.txt"
    } >"$pre/MANIFEST"
    tar -C "$pre" --owner=0 --group=0 -czf "$PACK_DIR/prebuilt.tar.gz" .
    rm -rf "$pre"
    echo "pack: $PACK_DIR/prebuilt.tar.gz $(du -h "$PACK_DIR/prebuilt.tar.gz" | cut -f1) (shardline + $n gpu tests)"
  fi
  # The model shapes and the stories260K reference of ../shared (2 MB), for a
  # machine without ../shared (run's --shared falls back to .gpucheck/shared).
  if [[ -d "$SHARED/models" ]]; then
    rm -rf "$PACK_DIR/shared" && mkdir -p "$PACK_DIR/shared" && cp -rL "$SHARED/models" "$PACK_DIR/shared/" &&
      chmod -R u+w "$PACK_DIR/shared" && echo "pack: $PACK_DIR/shared/models ($(du -sh "$PACK_DIR/shared" | cut -f1))"
  fi
  local ex; ex="$(git -C "$REPO" rev-parse --path-format=absolute --git-path info/exclude 2>/dev/null)"
  if [[ -n "$ex" ]] && ! grep -qx '/.gpucheck/' "$ex" 2>/dev/null; then
    mkdir -p "$(dirname "$ex")" && echo '/.gpucheck/' >>"$ex"
  fi
  echo "pack: carry it with the device call: carry [\".gpucheck\"], command 'bash deploy/gpu-check.sh'"
}

if [[ "$MODE" == pack ]]; then pack; exit $?; fi

# ================================ run (GPU machine) ================================
STEP_NAMES=()
STEP_RESULTS=()
STEP_SECONDS=()

note() { echo "gpu-check [$(printf '%4d' "$SECONDS") s] $*"; }
left() { echo $((BUDGET - SECONDS)); }

# step NAME MIN_SECONDS CAP_SECONDS CMD...: runs CMD under timeout
# min(CAP, time left - 5) when at least MIN_SECONDS are left, else skips it.
step() {
  local name="$1" min="$2" cap="$3"; shift 3
  local l; l=$(left)
  if (( l < min )); then
    note "SKIP $name: $l s left of the budget, it needs $min s"
    STEP_NAMES+=("$name"); STEP_RESULTS+=("skipped (budget)"); STEP_SECONDS+=(0)
    return 1
  fi
  local t=$(( l - 5 < cap ? l - 5 : cap ))
  note "==== $name (timeout $t s): $*"
  if (( DRY_RUN )); then STEP_NAMES+=("$name"); STEP_RESULTS+=("dry-run"); STEP_SECONDS+=(0); return 0; fi
  local t0=$SECONDS rc
  timeout -k 10 "$t" "$@"
  rc=$?
  local result=ok
  if (( rc == 124 || rc == 137 )); then result="TIMEOUT after $t s"; elif (( rc != 0 )); then result="FAILED rc=$rc"; fi
  STEP_NAMES+=("$name"); STEP_RESULTS+=("$result"); STEP_SECONDS+=($((SECONDS - t0)))
  note "==== $name: $result ($((SECONDS - t0)) s)"
  return "$rc"
}

shape_dir() {
  if [[ -f "$SHARED/models/shapes/$1/config.json" ]]; then echo "$SHARED/models/shapes/$1";
  elif [[ -f "$REPO/bench/shapes/$1/config.json" ]]; then echo "$REPO/bench/shapes/$1";
  else echo ""; fi
}

environment() {
  note "repo $REPO, out $OUT_DIR, budget $BUDGET s"
  (. /etc/os-release 2>/dev/null && echo "os: $PRETTY_NAME"); echo "glibc: $(ldd --version 2>/dev/null | head -1)"
  echo "cpus: $(nproc), memory: $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
  if command -v nvidia-smi >/dev/null; then
    echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -4)"
  else
    echo "gpu: no nvidia-smi"
  fi
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"; echo "g++: $(g++ --version 2>/dev/null | head -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1), ninja: $(ninja --version 2>/dev/null)"
  echo "python3: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
  echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null) (+ working tree diff sha1 $(git -C "$REPO" diff HEAD 2>/dev/null | sha1sum | cut -c1-12))"
}

# Headers / tools of the build dependencies, to say what the machine lacks.
missing_deps() {
  local h miss=()
  for h in nlohmann/json.hpp CLI/CLI.hpp caf/all.hpp capnp/message.h rocksdb/db.h sentencepiece_processor.h \
           spdlog/spdlog.h pcre2.h utf8proc.h httplib.h openssl/hmac.h gtest/gtest.h gmock/gmock.h \
           gflags/gflags.h snappy.h zlib.h bzlib.h lz4.h zstd.h; do
    [[ -e "/usr/include/$h" || -e "/usr/local/include/$h" ]] || miss+=("$h")
  done
  [[ -e /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h || -e /usr/include/openblas/cblas.h ]] || miss+=(cblas.h)
  command -v capnp >/dev/null || miss+=(capnp)
  command -v pkg-config >/dev/null || miss+=(pkg-config)
  echo "${miss[*]}"
}

install_deps() {
  local miss; miss="$(missing_deps)"
  if [[ -z "$miss" ]]; then note "build dependencies: all present"; return 0; fi
  note "build dependencies missing here: $miss"
  if [[ ! -f "$PACK_DIR/deps.tar.gz" ]]; then
    note "no $PACK_DIR/deps.tar.gz: run 'bash deploy/gpu-check.sh pack' on the dev machine and carry .gpucheck"
    return 1
  fi
  if [[ "$(id -u)" != 0 ]]; then note "unpacking the dependencies into / needs root"; return 1; fi
  (( DRY_RUN )) && { note "would unpack $PACK_DIR/deps.tar.gz into /"; return 0; }
  # Never replace a file of the machine's own (--skip-old-files), never turn
  # /lib -> usr/lib style links into directories (--keep-directory-symlink).
  tar -C / --skip-old-files --keep-directory-symlink --no-same-owner -xzf "$PACK_DIR/deps.tar.gz" || return 1
  ldconfig
  head -1 /usr/share/shardline-gpucheck-deps.txt 2>/dev/null
  miss="$(missing_deps)"
  [[ -z "$miss" ]] || { note "still missing after unpacking: $miss"; return 1; }
  note "build dependencies unpacked"
}

SL=""          # the shardline binary
TEST_DIR=""    # where the gpu test executables are
USE_CTEST=0

build() {
  local targets; mapfile -t targets < <(echo shardline; gpu_test_targets)
  export CMAKE_POLICY_VERSION_MINIMUM=3.5  # CMake 4 and old package config files
  local shared_arg=()
  [[ -d "$SHARED" ]] && shared_arg=(-DSHARDLINE_SHARED_DIR="$(cd "$SHARED" && pwd)")
  step configure 30 120 cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDLINE_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES=90a "${shared_arg[@]}" || return 1
  # -k 0: build every target that can be built, so one broken test leaves the rest.
  step build 60 360 cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" -- -k 0
}

use_prebuilt() {
  local p="$PACK_DIR/prebuilt.tar.gz" dir="$BUILD-prebuilt"
  [[ -f "$p" ]] || { note "no $p to fall back on"; return 1; }
  (( DRY_RUN )) && { note "would use $p"; SL="$dir/bin/shardline"; TEST_DIR="$dir/tests"; return 0; }
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$dir" -xzf "$p" || return 1
  note "using the prebuilt binaries: $(tr '\n' ';' <"$dir/MANIFEST")"
  # Tests find the demo model and shapes through the source dir compiled into
  # them (SHARDLINE_SOURCE_DIR, SHARDLINE_SHARED_DIR = its ../shared), and the
  # CLI through the build dir (SHARDLINE_BINARY_DIR/cli/shardline).
  local src bin; src="$(sed -n 's/^built from \(.*\) at commit.*/\1/p' "$dir/MANIFEST")"
  bin="$(sed -n 's/^binary dir //p' "$dir/MANIFEST")"
  if [[ -n "$src" && ! -e "$src" ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$REPO" "$src" && note "linked $src -> $REPO"
    [[ -e "$(dirname "$src")/shared" || ! -d "$SHARED" ]] || ln -s "$(cd "$SHARED" && pwd)" "$(dirname "$src")/shared"
  fi
  if [[ -n "$bin" && ! -e "$bin/cli/shardline" ]]; then
    mkdir -p "$bin/cli" && ln -s "$dir/bin/shardline" "$bin/cli/shardline" && note "linked $bin/cli/shardline"
  fi
  # Built elsewhere: the CUDA runtime and cuBLASLt may sit in another folder of the toolkit here.
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -d "$d" ]] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  # The machine's own libraries of the same soname win in / (--skip-old-files)
  # and may be other versions (Ubuntu's libsentencepiece.so.0 crashed these
  # binaries): the packed ones, unpacked apart, are loaded first.
  if [[ -f "$PACK_DIR/deps.tar.gz" ]]; then
    local deps="$BUILD-deps"
    if [[ ! -d "$deps/usr" ]]; then mkdir -p "$deps" && tar -C "$deps" -xzf "$PACK_DIR/deps.tar.gz" || return 1; fi
    export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    note "the prebuilt binaries load the packed libraries first ($deps/usr/lib/x86_64-linux-gnu)"
  fi
  SL="$dir/bin/shardline"; TEST_DIR="$dir/tests"; USE_CTEST=0
  ldd "$SL" | grep "not found" && note "warning: libraries missing for $SL"
  return 0
}

# $1: a gtest filter ("" = every test).
run_gpu_tests_direct() {
  local t rc=0 filter=()
  [[ -n "${1:-}" ]] && filter=("--gtest_filter=$1")
  for t in $(gpu_test_targets); do
    [[ -x "$TEST_DIR/$t" ]] || { echo "missing test executable $t"; rc=1; continue; }
    echo "---- $t"
    OMP_WAIT_POLICY=PASSIVE "$TEST_DIR/$t" --gtest_brief=1 "${filter[@]}" || rc=1
  done
  return "$rc"
}

# The ctest -R / -E regex of the group stage's tests (GROUP_TESTS as a regex).
group_tests_regex() { echo "$GROUP_TESTS" | sed 's/\*//g; s/:/|/g'; }

# The group stage (issue 41 item 9): the gpu tests of engine groups whose
# ranks share GPU 0 (tp, pp, sp, Seesaw, Shift and SiDP jobs against the
# CPU groups), then the first model's bench on GROUP_PARALLEL beside its
# single-GPU bench.
group_stage() {
  if (( !DO_TESTS )); then :
  elif (( USE_CTEST )); then
    step "group tests" 30 200 ctest --test-dir "$BUILD" -L gpu -R "$(group_tests_regex)" --output-on-failure \
      -j "$TEST_JOBS" --timeout 200
  else
    step "group tests" 30 200 bash -c "run_gpu_tests_direct '$GROUP_TESTS'"
  fi
  (( DO_BENCH )) || return 0
  local m dir; m="${MODELS%% *}"; dir="$(shape_dir "$m")"
  [[ -n "$dir" ]] || return 0
  local layers=(); (( NUM_LAYERS > 0 )) && layers=(--num-layers "$NUM_LAYERS")
  # shellcheck disable=SC2086
  step "bench $m $GROUP_PARALLEL" 60 300 bash -c '"$@" >"'"$OUT_DIR/bench-$m-group.json"'"' _ \
    "$SL" bench --shape "$dir" --device cuda:0 --parallel "$GROUP_PARALLEL" --dtype bf16 --kv-cache-dtype bf16 \
    --num-prompts "$NUM_PROMPTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --max-batch "$MAX_BATCH" \
    --max-num-batched-tokens "$MAX_TOKENS" --gpu-memory-utilization "$GPU_UTIL" "${layers[@]}" $BENCH_ARGS
  [[ -s "$OUT_DIR/bench-$m-group.json" ]] && cat "$OUT_DIR/bench-$m-group.json"
  return 0
}

bench_model() {
  local m="$1" dir; dir="$(shape_dir "$m")"
  if [[ -z "$dir" ]]; then note "no shape $m under $SHARED/models/shapes or bench/shapes"; return 1; fi
  local layers=(); (( NUM_LAYERS > 0 )) && layers=(--num-layers "$NUM_LAYERS")
  # shellcheck disable=SC2086
  step "bench $m" 60 300 bash -c '"$@" >"'"$OUT_DIR/bench-$m.json"'"' _ \
    "$SL" bench --shape "$dir" --device cuda:0 --dtype bf16 --kv-cache-dtype bf16 \
    --num-prompts "$NUM_PROMPTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --max-batch "$MAX_BATCH" \
    --max-num-batched-tokens "$MAX_TOKENS" --gpu-memory-utilization "$GPU_UTIL" "${layers[@]}" $BENCH_ARGS
  [[ -s "$OUT_DIR/bench-$m.json" ]] && cat "$OUT_DIR/bench-$m.json"
  return 0
}

torch_model() {
  local m="$1" dir; dir="$(shape_dir "$m")"
  [[ -n "$dir" ]] || return 1
  local layers=(); (( NUM_LAYERS > 0 )) && layers=(--num-layers "$NUM_LAYERS")
  # shellcheck disable=SC2086
  step "torch $m" 45 200 bash -c '"$@" >"'"$OUT_DIR/torch-$m.json"'"' _ \
    env PYTHONUNBUFFERED=1 python3 "$REPO/bench/torch_reference.py" --shape "$dir" --num-prompts "$NUM_PROMPTS" \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --batch-size "$MAX_BATCH" "${layers[@]}" $TORCH_ARGS
  [[ -s "$OUT_DIR/torch-$m.json" ]] && cat "$OUT_DIR/torch-$m.json"
  return 0
}

summary() {
  echo
  echo "================================ gpu-check summary ================================"
  local i
  for i in "${!STEP_NAMES[@]}"; do printf '  %-26s %-24s %4s s\n' "${STEP_NAMES[$i]}" "${STEP_RESULTS[$i]}" "${STEP_SECONDS[$i]}"; done
  echo "  total $SECONDS s of a $BUDGET s budget"
  (( DRY_RUN )) && return 0
  local steps_json="["
  for i in "${!STEP_NAMES[@]}"; do
    steps_json+="{\"step\": \"${STEP_NAMES[$i]}\", \"result\": \"${STEP_RESULTS[$i]}\", \"seconds\": ${STEP_SECONDS[$i]}},"
  done
  steps_json="${steps_json%,}]"
  STEPS_JSON="$steps_json" OUT_DIR="$OUT_DIR" MODELS="$MODELS" python3 - <<'EOF' || true
import json, os
out, models = os.environ["OUT_DIR"], os.environ["MODELS"].split()
def load(p):
    try:
        with open(p) as f:
            lines = [l for l in f if l.strip().startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
s = {"steps": json.loads(os.environ["STEPS_JSON"]), "models": {}}
for m in models:
    b, t = load(f"{out}/bench-{m}.json"), load(f"{out}/torch-{m}.json")
    s["models"][m] = {"shardline": b, "torch": t}
    print(f"  {m}:")
    if b:
        print(f"    shardline  {b['total_tok_s']:8.0f} tok/s total (target {b['target_total_tok_s']:.0f}: "
              f"{'met' if b['meets_throughput_target'] else 'NOT met'}), prefill {b['prefill_tok_s']:.0f}, "
              f"decode {b['decode_tok_s']:.0f} tok/s")
        print(f"               decode step {b['decode_step_ms']:.2f} ms vs HBM roofline {b['roofline_step_ms']:.2f} ms "
              f"= {b['roofline_ratio']:.2f}x (target <= {b['target_roofline_ratio']}: "
              f"{'met' if b['meets_roofline_target'] else 'NOT met'}), batch {b['decode_batch_min']}..{b['decode_batch_max']}")
        print(f"               prefill {b['prefill_tflops']:.0f} TFLOP/s = {100 * b['prefill_gemm_ratio']:.0f}% of "
              f"{b['gemm_tflops']:.0f}; HBM {b['hbm_gbs']:.0f} GB/s; graphs {100 * b['graph_fraction']:.0f}% "
              f"{b['graph_capture_error'] or ''}")
    else:
        print("    shardline  no result")
    g = load(f"{out}/bench-{m}-group.json")
    if g:
        s["models"][m]["group"] = g
        ratio = f" = {g['total_tok_s'] / b['total_tok_s']:.2f}x the single GPU" if b else ""
        print(f"    group      {g['total_tok_s']:8.0f} tok/s total on {g.get('parallel', '?')} sharing GPU 0{ratio}, "
              f"decode step {g['decode_step_ms']:.2f} ms")
    if t:
        keys = [k for k in ("total_tok_s", "prefill_tok_s", "decode_tok_s", "decode_step_ms", "roofline_ratio", "mode")
                if k in t]
        print("    torch      " + ", ".join(f"{k} {t[k]:.2f}" if isinstance(t[k], float) else f"{k} {t[k]}" for k in keys))
    else:
        print("    torch      no result")
with open(f"{out}/summary.json", "w") as f:
    json.dump(s, f, indent=1)
EOF
}

main() {
  if [[ ! -d "$SHARED/models" && -d "$PACK_DIR/shared/models" ]]; then SHARED="$PACK_DIR/shared"; fi
  [[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
  environment
  # shardline is needed by the tests and the benchmarks only (not by the torch reference).
  local have_bin=0
  # A build on the machine fails (header notes); the bundle is the way in.
  if (( !FORCE_BUILD && DO_BUILD )) && [[ -f "$PACK_DIR/prebuilt.tar.gz" ]]; then FORCE_PREBUILT=1; fi
  if (( DO_TESTS || DO_BENCH )); then
    if (( FORCE_PREBUILT )); then
      install_deps  # the prebuilt binaries link the same shared libraries
      use_prebuilt && have_bin=1
    else
      if (( DO_BUILD )); then
        install_deps && build
      fi
      # A test target that fails to build leaves the others and shardline usable.
      if (( DRY_RUN )) || [[ -x "$BUILD/cli/shardline" ]]; then
        SL="$BUILD/cli/shardline"; TEST_DIR="$BUILD/tests"; USE_CTEST=1; have_bin=1
      else
        note "no $BUILD/cli/shardline; trying the prebuilt binaries"
        use_prebuilt && have_bin=1
      fi
    fi
    (( have_bin )) || note "no shardline binary: skipping the gpu tests and the Shardline benchmarks"
  fi
  if (( DO_TESTS && have_bin )); then
    if (( USE_CTEST )); then
      # Each test case is one process (gtest_discover_tests): a few at a time share the GPU.
      step "gpu tests" 30 150 ctest --test-dir "$BUILD" -L gpu -E "$(group_tests_regex)" --output-on-failure \
        -j "$TEST_JOBS" --timeout 150
    else
      step "gpu tests" 30 150 bash -c "run_gpu_tests_direct '-$GROUP_TESTS'"
    fi
  fi
  # Shardline on every model first, then the PyTorch reference points.
  local m
  if (( DO_BENCH && have_bin )); then for m in $MODELS; do bench_model "$m"; done; fi
  if (( DO_GROUP && have_bin )); then group_stage; fi
  if (( DO_TORCH )); then for m in $MODELS; do torch_model "$m"; done; fi
  summary
  (( have_bin || ! (DO_TESTS || DO_BENCH) )) || return 1
  local r
  for r in "${STEP_RESULTS[@]}"; do [[ "$r" == ok || "$r" == dry-run ]] || return 1; done
  return 0
}

export -f run_gpu_tests_direct gpu_test_targets 2>/dev/null
export GROUP_TESTS
export TEST_DIR REPO
mkdir -p "$OUT_DIR"
if (( DRY_RUN )); then
  main
else
  main 2>&1 | tee "$OUT_DIR/log"
fi
