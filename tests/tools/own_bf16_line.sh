#!/bin/sh
# bench step's line on how the float products run, with s3r's own bf16 GEMM (S3R_GEMM_BF16=dpbf16):
# where the CPU has AVX-512 BF16 the line says the bf16 products need no tiles; elsewhere asking
# for that backend fails before any work, in one line that says why.
# Usage: own_bf16_line.sh S3R_BINARY
s3r=$1
out=$(S3R_GEMM_BF16=dpbf16 "$s3r" bench step --preset tiny --configs bf16 --repeats 1 --warmup 0 --no-memory 2>&1)
status=$?
if [ "$status" = 0 ]; then
  echo "$out" | grep -q "f32 and bf16 products: the bf16 ones (every LM head, the bf16 mode's) by s3r's own GEMM.*the f32 mode's with oneDNN's own threading" && exit 0
else
  [ "$status" = 1 ] && echo "$out" | grep -q "^s3r: error: S3R_GEMM_BF16=dpbf16: this CPU (or S3R_MAX_ISA) gives no AVX-512 BF16" && exit 0
fi
echo "FAIL: exit status $status and:"
echo "$out"
exit 1
