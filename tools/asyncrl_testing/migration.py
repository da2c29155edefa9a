"""verl and AReaL configs for the ``asyncrl import`` tests: the unit tests (tests/unit/test_import_command.py,
tests/unit/test_import_anchors.py: fields, counts, refusals, the operator's admission) and the server-side
dry run on the real apiserver (tests/cluster/test_import_dry_run.py).

VERL_FULLY_ASYNC_AGENT, AREAL_AGENT_ASYNC: configs written from the two frameworks' documented key names
(a verl fully_async agent loop with ``${oc.env:DATA_ROOT}`` paths; AReaL async GRPO with its agent mode,
an admin key from the environment and a literal W&B key that must never be copied). VERL_SEED,
AREAL_SEED: the seed documents' two configs as the blog posts print them (``shared/seeds/``). The
anchors' own examples are in ``migration_verl.py`` and ``migration_areal.py``.
"""

from __future__ import annotations

VERL_FULLY_ASYNC_AGENT = """
hydra: {searchpath: ["file://verl/trainer/config"]}
data:
  train_files: ["${oc.env:DATA_ROOT}/gsm8k/train.parquet"]
  val_files: ${oc.env:DATA_ROOT}/gsm8k/test.parquet
  prompt_key: prompt
  max_prompt_length: 1024
  max_response_length: 2048
  train_batch_size: 0
  return_raw_chat: true
reward:
  custom_reward_function: {path: /code/gsm8k_reward.py, name: compute_score}
actor_rollout_ref:
  hybrid_engine: false
  model: {path: /models/qwen2.5-7b-instruct, use_remove_padding: true}
  actor:
    strategy: fsdp2
    ppo_mini_batch_size: 32
    ppo_max_token_len_per_gpu: 12288
    use_dynamic_bsz: true
    clip_ratio_low: 0.2
    clip_ratio_high: 0.28
    use_kl_loss: false
    grad_clip: 1.0
    optim: {lr: 1.0e-6, weight_decay: 0.1}
  rollout:
    name: vllm
    n: 16
    temperature: 1.0
    tensor_model_parallel_size: 2
    gpu_memory_utilization: 0.8
    calculate_log_probs: true
    checkpoint_engine: {backend: nccl}
    multi_turn:
      enable: true
      max_user_turns: 8
      max_assistant_turns: 8
      max_parallel_calls: 2
      format: hermes
      tool_config_path: recipe/retool/sandbox_fusion_tool_config.yaml
algorithm:
  adv_estimator: grpo
  rollout_correction: {bypass_mode: true}
trainer:
  nnodes: 1
  n_gpus_per_node: 4
  experiment_name: Qwen2.5-7B_async_tool
  logger: [console, wandb]
  save_freq: 20
  default_local_dir: /ckpt/retool
rollout:
  nnodes: 1
  n_gpus_per_node: 4
  total_rollout_steps: 64000
  test_freq: 5
  max_concurrent_samples_per_replica: 16
async_training:
  staleness_threshold: 0.5
  trigger_parameter_sync_step: 4
  require_batches: 2
  partial_rollout: true
  use_trainer_do_validate: false
"""

AREAL_AGENT_ASYNC = """
experiment_name: gsm8k-agent
trial_name: trial0
tokenizer_path: ${actor.path}
cluster: {n_nodes: 1, n_gpus_per_node: 8, fileroot: /tmp/areal}
rollout:
  backend: "vllm:d4p1t1"
  max_concurrent_rollouts: 256
  queue_size: 64
  consumer_batch_size: ${train_dataset.batch_size}
  max_head_offpolicyness: 2
  agent:
    mode: inline
    export_style: individual
    turn_discount: 0.9
    max_turns: 6
    tool_call_parser: qwen25
    admin_api_key: ${oc.env:AREAL_ADMIN_API_KEY}
gconfig: {n_samples: 4, max_new_tokens: 1024, temperature: 1.0, greedy: false}
actor:
  backend: "fsdp:d4p1t1"
  path: /models/Qwen2.5-1.5B-Instruct
  dtype: bfloat16
  mb_spec: {max_tokens_per_mb: 10240}
  optimizer: {type: adam, lr: 1.70e-5, weight_decay: 0.017, beta1: 0.9, gradient_clipping: 1.0}
  eps_clip: 0.4
  kl_ctl: 0.0
  ppo_n_minibatches: 1
  use_decoupled_loss: true
  behav_imp_weight_cap: 5.0
  reward_norm: {mean_level: group, std_level: group, group_size: "${gconfig.n_samples}"}
  adv_norm: {mean_level: batch, std_level: batch}
  weight_update_mode: xccl
vllm: {max_model_len: 4096, gpu_memory_utilization: 0.8}
train_dataset: {batch_size: 256, path: /data/gsm8k/train.parquet, type: rl}
valid_dataset: {path: /data/gsm8k/test.parquet}
saver:
  freq_steps: 50
stats_logger:
  wandb: {mode: online, api_key: sk-literal-never-copied}
"""

# --- the seed documents (shared/seeds/), their configs as the posts print them ----------------------

VERL_SEED = """
# fully_async_ppo.yaml
trainer:
  class: FullyAsyncTrainer
  ppo_mini_batch_size: 64
  require_batches: 2
  trigger_parameter_sync_step: 4
  use_trainer_do_validate: true
rollouter:
  class: FullyAsyncRollouter
  max_queue_size: 512
  partial_rollout: true
message_queue:
  class: MessageQueue
  max_queue_size: 512
# agent_loop_config.yaml
agent_loop:
  name: tool_agent
  max_user_turns: 3
  max_assistant_turns: 5
  max_parallel_calls: 2
  tool_selection: per_sample
  tool_parser:
    name: function_call_parser
    stop_token_ids: [128009]
  llm_client:
    base_url: "https://taotoken.net/api"
    api_key: "${TAOTOKEN_API_KEY}"
    model: "your-rollout-model-id"
# separation_config.yaml
resource_pool:
  trainer_pool:
    num_gpus: 8
  rollout_pool:
    num_gpus: 8
actor_worker:
  class: DetachActorWorker
  strategy: fsdp2
"""

AREAL_SEED = """
# configs/agent_async_train.yaml
train:
  engine: archon
  parallelism:
    dp: 4
    tp: 2
    pp: 1
    cp: 1
    ep: 1
  global_batch_size: 64
  mini_batch_size: 8
  learning_rate: 1.0e-6
  max_steps: 2000
async:
  enabled: true
  rollout_workers: 8
  train_workers: 4
  staleness_threshold: 2
  queue_max_size: 256
  trigger_batch_size: 32
agent:
  gateway_config: "configs/taotoken_router.yaml"
  framework: "openclaw"
  max_turns: 10
  reward_source: "reward_model"
logging:
  log_dir: "./logs/areal_async"
  log_interval: 10
  save_interval: 200
"""
