#!/bin/sh
# e2e_cuda_llama.sh: test/e2e_hf_llama.sh on the GPU (run by `make test-cuda` only): the Hugging
# Face Llama cases (grouped-query, multi-query, tied) loaded, evaluated, stepped and exported with
# every op on the CUDA backend (rmsnorm, rope_gqa, swiglu, attention, cuBLASLt GEMMs); fp32 loss and
# gradients within 1e-4 of the float64 reference (sums in the GPU's orders; the CPU holds 1e-5),
# bf16 within 1e-2. Usage: e2e_cuda_llama.sh BUILD_DIR. Exit 77 (skipped) without a GPU.
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || { echo "no CUDA device: skipped"; exit 77; }
# The GPU machine has no tests venv: the live transformers checks run there only if it has one.
CT_HF_LIVE=optional CT_E2E_DEVICE=cuda CT_E2E_FP32_TOL=1e-4 exec sh "$(dirname "$0")/e2e_hf_llama.sh" "$@"
