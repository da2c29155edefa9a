"""AReaL's own examples for the ``asyncrl import`` tests (tests/unit/test_import_anchors.py), written from
their keys and values (not copied files): ``examples/math/gsm8k_grpo.yaml`` in full and every other math
example as the lines it changes there (Hydra overrides), search_agent and vlm likewise, tau2's
``config_8b_airline.yaml`` in full (its agent mode, archon, a W&B key inside a list) and its MoE
allocation.
"""

from __future__ import annotations

AREAL_GSM8K_GRPO = """
experiment_name: gsm8k-grpo
trial_name: trial0
seed: 1
enable_offload: false
total_train_epochs: 10
tokenizer_path: ${actor.path}
cluster:
  n_nodes: 1
  n_gpus_per_node: 8
  fileroot: /tmp/areal/experiments
  name_resolve: {type: nfs, nfs_record_root: /tmp/areal/name_resolve}
scheduler: {type: null}
rollout:
  backend: "sglang:d4p1t1"
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  max_concurrent_rollouts: 256
  queue_size: null
  consumer_batch_size: ${train_dataset.batch_size}
  max_head_offpolicyness: 2
  enable_rollout_tracing: false
  scheduling_spec: ${actor.scheduling_spec}
  fileroot: ${cluster.fileroot}
  tokenizer_path: ${tokenizer_path}
  dump_to_file: true
gconfig: {n_samples: 4, min_new_tokens: 0, max_new_tokens: 1024, greedy: false, temperature: 1.0}
actor:
  backend: "fsdp:d4p1t1"
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  path: Qwen/Qwen2.5-1.5B-Instruct
  init_from_scratch: false
  disable_dropout: true
  gradient_checkpointing: true
  dtype: bfloat16
  mb_spec: {max_tokens_per_mb: 10240, packing_algorithm: ffd}
  optimizer:
    type: adam
    lr: 1.70e-5
    weight_decay: 0.017
    beta1: 0.9
    beta2: 0.999
    eps: 1e-8
    lr_scheduler_type: constant
    gradient_clipping: 1.0
    warmup_steps_proportion: 0.001
  eps_clip: 0.4
  temperature: ${gconfig.temperature}
  reward_scaling: 10.0
  reward_bias: -0.5
  kl_ctl: 0.0
  ppo_n_minibatches: 1
  recompute_logprob: true
  use_decoupled_loss: true
  rejection_sampling: {metric: ratio, upper: 5.0}
  reward_norm: {mean_level: group, std_level: group, group_size: "${gconfig.n_samples}"}
  adv_norm: {mean_level: batch, std_level: batch}
  weight_update_mode: xccl
  max_new_tokens: ${gconfig.max_new_tokens}
  scheduling_spec:
    - task_type: worker
      port_count: 2
      gpu: 1
      mem: 32
      cmd: python3 -m areal.infra.rpc.rpc_server
      env_vars: {}
ref:
  backend: ${actor.backend}
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  path: ${actor.path}
  init_from_scratch: false
  disable_dropout: true
  dtype: ${actor.dtype}
  mb_spec: {max_tokens_per_mb: 10240, packing_algorithm: ffd}
  optimizer: null
  scheduling_strategy: {type: colocation, target: actor}
  scheduling_spec: ${actor.scheduling_spec}
sglang:
  model_path: ${actor.path}
  random_seed: ${seed}
  skip_tokenizer_init: true
  dtype: ${actor.dtype}
  max_running_requests: null
  context_length: 32768
  mem_fraction_static: 0.8
vllm:
  model: ${actor.path}
  seed: ${seed}
  skip_tokenizer_init: false
  dtype: ${actor.dtype}
  max_model_len: 32768
  gpu_memory_utilization: 0.8
train_dataset:
  {batch_size: 256, shuffle: true, pin_memory: true, num_workers: 4, path: openai/gsm8k, type: rl,
   max_length: 1024}
valid_dataset: {batch_size: 256, pin_memory: true, num_workers: 4, path: openai/gsm8k, type: rl}
saver:
  experiment_name: "${experiment_name}"
  trial_name: "${trial_name}"
  fileroot: "${cluster.fileroot}"
  freq_epochs: 1
  freq_steps: null
  freq_secs: null
recover:
  mode: disabled
  experiment_name: "${experiment_name}"
  trial_name: "${trial_name}"
  fileroot: "${cluster.fileroot}"
  freq_epochs: 1
  freq_steps: null
  freq_secs: 3600
evaluator:
  experiment_name: "${experiment_name}"
  trial_name: "${trial_name}"
  fileroot: "${cluster.fileroot}"
  freq_epochs: 1
  freq_steps: null
  freq_secs: null
stats_logger:
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  fileroot: ${cluster.fileroot}
  wandb: {mode: disabled}
perf_tracer:
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  fileroot: ${cluster.fileroot}
  enabled: false
  session_tracer: {enabled: false}
"""

_VLLM_09 = "vllm.gpu_memory_utilization=0.9"
AREAL_MATH = {
    "gsm8k_grpo": [],
    "gsm8k_drgrpo": ["actor.reward_norm.std_level=null", "~actor.max_new_tokens", _VLLM_09],
    "gsm8k_rloo": [
        "experiment_name=gsm8k-rloo",
        "+actor.reward_norm.mean_leave1out=true",
        "actor.reward_norm.std_level=null",
        _VLLM_09,
    ],
    "gsm8k_gspo": ["experiment_name=gsm8k-gspo", "+actor.importance_sampling_level=sequence", _VLLM_09],
    "gsm8k_reinforce": [
        "experiment_name=gsm8k-reinforce-plus-plus",
        "actor.kl_ctl=0.001",
        "+actor.kl_estimator=k1",
        "~actor.reward_norm",
        _VLLM_09,
    ],
    "gsm8k_ppo": [
        "experiment_name=gsm8k-ppo",
        "~actor.reward_norm",
        "+critic.backend=${actor.backend}",
        "+critic.is_critic=true",
        "+critic.path=${actor.path}",
        "+critic.eps_clip=0.5",
        "+critic.ppo_n_minibatches=${actor.ppo_n_minibatches}",
        "+critic.mb_spec.max_tokens_per_mb=10240",
        "+critic.optimizer=${actor.optimizer}",
        _VLLM_09,
    ],
    "gsm8k_grpo_lora": [
        "rollout.backend=sglang:d4",
        "+rollout.use_lora=true",
        "+gconfig.lora_name=lora-gsm8k",
        "actor.backend=fsdp:d4",
        "actor.optimizer.lr=1.70e-4",
        "actor.weight_update_mode=disk",
        "+actor.use_lora=${rollout.use_lora}",
        "+actor.peft_type=lora",
        "+actor.lora_rank=16",
        "+actor.lora_alpha=16",
        "+actor.target_modules=[all-linear]",
        "+sglang.enable_lora=${actor.use_lora}",
        "+sglang.max_lora_rank=${actor.lora_rank}",
        "+vllm.enable_lora=${rollout.use_lora}",
        "+vllm.max_lora_rank=${actor.lora_rank}",
        _VLLM_09,
    ],
    "gsm8k_reinforce_baseline": [
        "experiment_name=gsm8k-reinforce-baseline",
        "actor.kl_ctl=0.001",
        "+actor.kl_estimator=k2",
        "actor.reward_norm.std_level=null",
        _VLLM_09,
    ],
    "gsm8k_sapo": [
        "experiment_name=gsm8k-sapo",
        "actor.recompute_logprob=false",
        "actor.use_decoupled_loss=false",
        "+actor.use_sapo_loss=true",
        "+actor.sapo_tau_pos=1.0",
        "+actor.sapo_tau_neg=1.05",
        _VLLM_09,
    ],
    "gsm8k_dapo_dynamic_bs": [
        "experiment_name=gsm8k-dapo",
        "+dynamic_bs=true",
        "rollout.backend=sglang:d4",
        "gconfig.max_new_tokens=4096",
        "actor.backend=fsdp:d4",
        "actor.path=Qwen/Qwen2.5-1.5B",
        "actor.eps_clip=0.2",
        "+actor.eps_clip_higher=0.28",
        "+actor.overlong_reward_penalty=true",
        "+actor.overlong_tokens=512",
        "+actor.overlong_penalty_factor=1.0",
        _VLLM_09,
    ],
    "gsm8k_m2po": ["experiment_name=gsm8k-m2po", "actor.eps_clip=0.0", "+actor.m2_threshold=0.04", _VLLM_09],
    "gsm8k_liteppo": ["actor.reward_norm.std_level=batch", "~actor.max_new_tokens", _VLLM_09],
}
"""AReaL's examples/math/<name>.yaml as the lines each changes in gsm8k_grpo.yaml (Hydra overrides)."""

AREAL_SEARCH_AGENT = [
    "experiment_name=asearcher-1.5b-zero-local",
    "trial_name=run1",
    "+total_train_steps=null",
    "rollout.max_concurrent_rollouts=128",
    "rollout.max_head_offpolicyness=4",
    "rollout.enable_rollout_tracing=true",
    "gconfig.n_samples=16",
    "actor.path=Qwen/Qwen2.5-1.5B",
    "actor.mb_spec.max_tokens_per_mb=8000",
    "~actor.mb_spec.packing_algorithm",
    "actor.optimizer.lr=5e-6",
    "actor.optimizer.weight_decay=0.01",
    "~actor.weight_update_mode",
    "~actor.max_new_tokens",
    "+actor.log_agent_stats=true",
    "+actor.log_agent_stats_keys=[num_input_tokens, num_output_tokens, num_llm_gens, score, format_reward]",
    "ref.mb_spec.max_tokens_per_mb=32768",
    "~ref.mb_spec.packing_algorithm",
    "sglang.skip_tokenizer_init=false",
    "sglang.mem_fraction_static=0.9",
    "+sglang.attention_backend=fa3",
    "~vllm",
    "train_dataset.batch_size=128",
    "~train_dataset.num_workers",
    "train_dataset.path=path_to_training_data",
    "~train_dataset.type",
    "~train_dataset.max_length",
    "~valid_dataset",
    "saver.freq_steps=10",
    "saver.freq_secs=3600",
    "~stats_logger.wandb.mode",
    "evaluator.freq_epochs=null",
    "+max_turns=32",
]
"""examples/search_agent/local_1.5b_example.yaml as its changes to gsm8k_grpo.yaml."""

AREAL_VLM_CLEVR = [
    "experiment_name=clevr_count_70k-grpo",
    "trial_name=trial1",
    "total_train_epochs=3",
    "rollout.backend=sglang:d1p1t1",
    "rollout.max_head_offpolicyness=4",
    "gconfig.max_new_tokens=512",
    "actor.backend=fsdp:d7p1t1",
    "actor.path=Qwen/Qwen2.5-VL-3B-Instruct",
    "actor.mb_spec.max_tokens_per_mb=4096",
    "~actor.mb_spec.packing_algorithm",
    "actor.optimizer.lr=2e-6",
    "actor.optimizer.weight_decay=0.01",
    "~actor.weight_update_mode",
    "ref.mb_spec.max_tokens_per_mb=4096",
    "~ref.mb_spec.packing_algorithm",
    "sglang.max_running_requests=64",
    "+sglang.enable_multimodal=true",
    "vllm.gpu_memory_utilization=0.9",
    "train_dataset.batch_size=28",
    "train_dataset.path=BUAADreamer/clevr_count_70k",
    "~train_dataset.max_length",
    "valid_dataset.batch_size=28",
    "valid_dataset.path=BUAADreamer/clevr_count_70k",
]
"""examples/vlm/clevr_count_70k_grpo.yaml as its changes to gsm8k_grpo.yaml."""

AREAL_TAU2 = """
experiment_name: tau2-rl
trial_name: 7b-airline
seed: 1
enable_offload: false
total_train_epochs: 200
total_train_steps: 500
tokenizer_path: ${actor.path}
cluster:
  n_nodes: 3
  n_gpus_per_node: 8
  fileroot: /path/to/experiments
  name_resolve: {type: nfs, nfs_record_root: /path/to/name_resolve}
scheduler: {type: slurm}
gconfig:
  {n_samples: 8, min_new_tokens: 0, max_new_tokens: 8192, max_tokens: 32767, greedy: false, temperature: 1.0}
rollout:
  backend: "sglang:d16"
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  max_concurrent_rollouts: 256
  queue_size: null
  consumer_batch_size: ${train_dataset.batch_size}
  max_head_offpolicyness: 2
  enable_rollout_tracing: false
  scheduling_spec: ${actor.scheduling_spec}
  fileroot: ${cluster.fileroot}
  tokenizer_path: ${tokenizer_path}
  dump_to_file: true
  agent:
    mode: inline
    tool_call_parser: qwen25
    reasoning_parser: qwen3
    engine_max_tokens: ${gconfig.max_tokens}
    export_style: individual
    turn_discount: 1.0
actor:
  backend: "archon:d8"
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  path: Qwen/Qwen3-8B
  init_from_scratch: false
  disable_dropout: true
  gradient_checkpointing: true
  dtype: bfloat16
  mb_spec: {max_tokens_per_mb: 32768}
  optimizer:
    type: adam
    lr: 1.7e-5
    weight_decay: 0.017
    beta1: 0.9
    beta2: 0.999
    eps: 1e-8
    lr_scheduler_type: constant
    gradient_clipping: 1.0
    warmup_steps_proportion: 0.001
  eps_clip: 0.4
  temperature: ${gconfig.temperature}
  reward_scaling: 10.0
  reward_bias: -0.5
  kl_ctl: 0.0
  ppo_n_minibatches: 1
  recompute_logprob: true
  use_decoupled_loss: true
  rejection_sampling: {metric: ratio, upper: 5.0}
  reward_norm: null
  adv_norm: {mean_level: batch, std_level: batch}
  max_new_tokens: ${gconfig.max_new_tokens}
  pad_to_maximum: true
  enable_tree_training: true
  scheduling_spec:
    - task_type: worker
      port_count: 2
      gpu: 1
      cpu: 4
      mem: 32
      cmd: python3 -m areal.infra.rpc.rpc_server
      env_vars:
        NCCL_DEBUG: "WARN"
        TAU2_DATA_DIR: /path/to/tau2-bench/data
        WANDB_BASE_URL: your-wandb-url
        WANDB_API_KEY: your-wandb-api-key
        AREAL_PROXY_WARN_ONCE: "1"
      additional_bash_cmds:
        - uv pip install git+https://github.com/dhh1995/tau2-bench.git@dhh/async-and-custom-completion
ref:
  backend: ${actor.backend}
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  path: ${actor.path}
  init_from_scratch: false
  disable_dropout: true
  dtype: ${actor.dtype}
  mb_spec: {max_tokens_per_mb: 32768}
  optimizer: null
econfig:
  domain: airline
  max_steps: 50
  add_thinking_tool: false
  solo_mode: false
  user_llm_base_url: http://localhost:8000/v1/
  user_llm: openai/self-hosted-Qwen2.5-72B
  user_llm_args: {temperature: 0.0, max_completion_tokens: 512}
  turn_discount: 1.0
  invalid_format_penalty: 0.1
sglang:
  model_path: ${actor.path}
  random_seed: ${seed}
  skip_tokenizer_init: true
  dtype: ${actor.dtype}
  max_running_requests: null
  context_length: 32768
  mem_fraction_static: 0.8
vllm:
  model: ${actor.path}
  seed: ${seed}
  skip_tokenizer_init: false
  dtype: ${actor.dtype}
  max_model_len: 32768
  gpu_memory_utilization: 0.9
train_dataset:
  {batch_size: 30, shuffle: true, pin_memory: true, num_workers: 4, path: tau2/train, type: rl,
   max_length: 1024}
valid_dataset:
  {batch_size: 16, shuffle: true, pin_memory: true, num_workers: 4, path: tau2/test, type: rl,
   drop_last: false}
saver:
  experiment_name: "${experiment_name}"
  trial_name: "${trial_name}"
  fileroot: "${cluster.fileroot}"
  freq_epochs: 1
  freq_steps: null
  freq_secs: null
recover:
  mode: disabled
  experiment_name: "${experiment_name}"
  trial_name: "${trial_name}"
  fileroot: "${cluster.fileroot}"
  freq_epochs: 1
  freq_steps: null
  freq_secs: 3600
evaluator:
  experiment_name: "${experiment_name}"
  trial_name: "${trial_name}"
  fileroot: "${cluster.fileroot}"
  freq_epochs: null
  freq_steps: null
  freq_secs: null
stats_logger:
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  fileroot: ${cluster.fileroot}
  wandb: {mode: online}
perf_tracer:
  enabled: false
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  fileroot: ${cluster.fileroot}
  save_interval: 1
  session_tracer: {enabled: true, flush_threshold: 100}
"""
"""examples/tau2/config_8b_airline.yaml: AReaL's agent mode (the gateway), archon, a W&B key in a list."""

AREAL_TAU2_30B_MOE = ["rollout.backend=sglang:d8t4", "actor.backend=megatron:(attn:d4p4t2|ffn:d2p4e4)"]
"""examples/tau2/config_30b_moe_airline.yaml's allocation: the hybrid MoE syntax."""
