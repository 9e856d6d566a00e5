# lib_models.sh: the offload scripts' model, and comparing the models of runs (not itself a test),
# for e2e_offload.sh, e2e_nvme.sh, e2e_fit_offload.sh and e2e_cuda_offload.sh; sourced after
# lib_e2e.sh, from the repository root. A run NAME is $T/NAME (its train.run_dir); $B is ctrain
# and $PY a python3.
# offload_gpt_model: the offload scripts' GPT as a config's "model" value: 431 k parameters, 2 blocks
# of width 128 with 4 heads, no linear biases, a head tied to the 256-token embedding, sequence 32
# (its data: licence_tokens' byte tokens)
offload_gpt_model() {
    cat <<'JSON'
{
    "input": [32],
    "layers": [
      {"type": "embedding", "name": "wte", "vocab": 256, "dim": 128, "init": {"type": "normal", "std": 0.02}},
      {"type": "position_embedding", "name": "wpe", "max_len": 32},
      {"type": "repeat", "times": 2, "layers": [{"type": "transformer_block", "heads": 4, "bias": false}]},
      {"type": "layernorm", "name": "ln_f"},
      {"type": "linear", "name": "head", "out": 256, "bias": false, "tie": "wte.weight"}
    ],
    "loss": {"type": "cross_entropy"}
  }
JSON
}
# offload_gpt_config DEVICE: e2e_offload's and e2e_cuda_offload's config of that GPT on train.device
# DEVICE: AdamW, micro-batch 1 x accumulation 4, clipping 0.5, stage 2 with offload_optimizer "cpu"
# (pinned), sub_group_size 100 k, 20 steps on licence_tokens' $T/tok/train.bin
offload_gpt_config() {
    cat <<JSON
{
  "train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
  "gradient_clipping": 0.5,
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                        "sub_group_size": 100000},
  "model": $(offload_gpt_model),
  "data": {"train": {"format": "tokens", "path": "$T/tok/train.bin", "seq_len": 32}, "shuffle": true},
  "train": {"max_steps": 20, "seed": 7, "device": "$1", "threads": 2}
}
JSON
}
# model RUN [STEP]: run RUN's model at STEP (20) as one file: the checkpoint's model.safetensors, or
# for per-rank shards (ZeRO stages 1-3 on several ranks) their consolidation by `ctrain export`
model() {
    _d="$T/$1/checkpoints/global_step${2:-20}"
    if [ -f "$_d/model.safetensors" ]; then echo "$_d/model.safetensors"; return; fi
    "$B" export --checkpoint "$_d" --out "$T/$1.${2:-20}.weights.safetensors" >/dev/null 2>"$T/$1.export.err" &&
        echo "$T/$1.${2:-20}.weights.safetensors"
}
# close A B TOL: every tensor of A's and B's models within TOL relative (||a - b|| / ||a||)
close() {
    "$PY" - "$(model "$1")" "$(model "$2")" "$3" <<'EOF'
import json, math, struct, sys
from array import array
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return {k: array("f", b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in json.loads(b[8:8 + n]).items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys()
err = {k: math.sqrt(sum((x - y) ** 2 for x, y in zip(a[k], b[k]))) / max(math.sqrt(sum(x * x for x in a[k])), 1e-30)
       for k in a}
worst = max(err, key=err.get)
print(f"largest relative difference {err[worst]:.3g} ({worst})")
sys.exit(0 if err[worst] <= float(sys.argv[3]) else 1)
EOF
}
# same_bits A B [STEP]: A's and B's models hold the same tensors, byte for byte (an export's
# metadata names its source, so exports are compared by their tensors)
same_bits() {
    "$PY" - "$(model "$1" "${3:-20}")" "$(model "$2" "${3:-20}")" <<'EOF'
import json, struct, sys
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in json.loads(b[8:8 + n]).items() if k != "__metadata__"}
sys.exit(0 if load(sys.argv[1]) == load(sys.argv[2]) else 1)
EOF
}
