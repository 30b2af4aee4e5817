#!/usr/bin/env bash
# Assembles the tensor-core attention's hardware path (cl/attention_mma_nv.cl, inline PTX, not
# the emulated path the tests run) for NVIDIA GPUs without one: clang's NVPTX target compiles
# the OpenCL C to PTX with libclc's built-ins linked in, then CUDA's ptxas assembles it for
# sm_80 and sm_90, in every configuration of the tuning space (warps 1, 2, 4, 8 x key tiles 16,
# 32, 64 x half and bfloat16 inputs) at head widths 64 and 128 and, where the space's register
# budget allows it, 160. A compile or assembly error fails the run; ptxas -v's registers, spills
# and shared memory are printed per configuration, and spills are listed at the end.
# Without clang's NVPTX target, libclc's NVPTX library or ptxas it skips, saying which, and
# exits 0: CI's Debian has the first two (tools/scripts/bootstrap.sh ci-deps) but ptxas comes
# with CUDA (PATH, or /usr/local/cuda/bin).
# Usage: tools/scripts/assemble_ptx.sh [out-dir]   (default: a temporary directory)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

skip() { echo "assemble_ptx: skipped: $*"; exit 0; }
clang=""
for c in clang-15 clang-14 clang; do
  if command -v "$c" > /dev/null && "$c" -print-targets 2> /dev/null | grep -q nvptx64; then clang=$c; break; fi
done
[ -n "$clang" ] || skip "no clang with the NVPTX target (Debian: clang-15)"
libclc=""
for f in /usr/lib/clc/nvptx64--nvidiacl.bc /usr/lib/llvm-*/lib/clc/nvptx64--nvidiacl.bc; do
  [ -f "$f" ] && { libclc=$f; break; }
done
[ -n "$libclc" ] || skip "no libclc for nvptx64--nvidiacl (Debian: libclc-15)"
ptxas=$(command -v ptxas || true)
[ -n "$ptxas" ] || { [ -x /usr/local/cuda/bin/ptxas ] && ptxas=/usr/local/cuda/bin/ptxas; }
[ -n "$ptxas" ] || skip "no ptxas (CUDA's; not in Debian's main archive)"

out=${1:-$(mktemp -d)}
mkdir -p "$out"
echo "assemble_ptx: $clang, $libclc, $ptxas ($("$ptxas" --version | tail -1)); files in $out"
# The PTX ISA 7.2 of sm_80's mma.sync with bf16; NVIDIA's OpenCL compiler picks its own.
cflags=(-cl-std=CL1.2 -target nvptx64-nvidia-nvcl -Xclang -finclude-default-header -O2 -S
        -Xclang -target-cpu -Xclang sm_80 -Xclang -target-feature -Xclang +ptx72
        -Xclang -mlink-builtin-bitcode -Xclang "$libclc" -Wno-linker-warnings -I "$root/cl")
# src/kernels/attention_mma.c's register budget: the head padded to 16, DP/4 + DP/2 + keys/2 words.
budget=128
failed=0
spills=()
printf '%-4s %-3s %-3s %-5s %-6s %5s %6s %6s %6s\n' d W KT type arch regs st_spl ld_spl smem
for d in 64 128 160; do
  dp=$(( (d + 15) / 16 * 16 ))
  for kt in 16 32 64; do
    [ $(( dp / 4 + dp / 2 + kt / 2 )) -le $budget ] || continue
    for w in 1 2 4 8; do
      for bf16 in 0 1; do
        type=$([ $bf16 = 1 ] && echo bf16 || echo f16)
        name="d${d}_w${w}_k${kt}_${type}"
        if ! "$clang" "${cflags[@]}" -DHEAD_DIM="$d" -DATT_KB=16 -DMMA_WARPS="$w" -DLOC_KEYS="$kt" -DMMA_BF16="$bf16" \
            "$root/cl/attention_mma_nv.cl" -o "$out/$name.ptx" 2> "$out/$name.clang.log"; then
          echo "assemble_ptx: $name: clang FAILED"; cat "$out/$name.clang.log"; failed=1; continue
        fi
        for arch in sm_80 sm_90; do
          if ! "$ptxas" -arch="$arch" -v "$out/$name.ptx" -o "$out/$name.$arch.cubin" > "$out/$name.$arch.log" 2>&1; then
            echo "assemble_ptx: $name $arch: ptxas FAILED"; cat "$out/$name.$arch.log"; failed=1; continue
          fi
          log="$out/$name.$arch.log"
          regs=$(sed -n 's/.*Used \([0-9]*\) registers.*/\1/p' "$log")
          st=$(sed -n 's/.* \([0-9]*\) bytes spill stores.*/\1/p' "$log")
          ld=$(sed -n 's/.* \([0-9]*\) bytes spill loads.*/\1/p' "$log")
          smem=$(sed -n 's/.* \([0-9]*\) bytes smem.*/\1/p' "$log")
          printf '%-4s %-3s %-3s %-5s %-6s %5s %6s %6s %6s\n' "$d" "$w" "$kt" "$type" "$arch" "$regs" "$st" "$ld" "$smem"
          [ "${st:-0}" = 0 ] && [ "${ld:-0}" = 0 ] || spills+=("$name $arch: $st bytes stored, $ld loaded")
        done
      done
    done
  done
done
if [ ${#spills[@]} -gt 0 ]; then
  echo "assemble_ptx: configurations that spill:"
  printf '  %s\n' "${spills[@]}"
else
  echo "assemble_ptx: no configuration spills"
fi
[ $failed -eq 0 ] && echo "assemble_ptx: every configuration assembled"
exit $failed
