"""verl's own examples for the ``asyncrl import`` tests (tests/unit/test_import_anchors.py), written from
their keys and values (not copied files): a recipe config (the keys verl's ``fully_async_ppo_trainer.yaml`` /
``one_step_off_ppo_trainer.yaml`` set over ``ppo_trainer``) plus the key=value overrides a shell recipe
passes, as verl composes them; the algorithm examples as their algorithm lines over the one_step_off
GRPO recipe; the algorithm part of verl's generated default config.
"""

from __future__ import annotations

VERL_FULLY_ASYNC_CONFIG = """
hydra: {searchpath: ["file://verl/trainer/config"]}
defaults: [ppo_trainer, _self_]
async_training:
  staleness_threshold: 0.1
  trigger_parameter_sync_step: 4
  require_batches: 1
  partial_rollout: true
  use_rollout_log_probs: true
  compute_prox_log_prob: false
  use_trainer_do_validate: false
  checkpoint_engine: {enable: true, device_buffer_size_M: 4096, overlap_broadcast_and_consume: false}
rollout: {nnodes: 1, n_gpus_per_node: 8, n: 4, total_rollout_steps: 100, total_epochs: 10, test_freq: 1}
data: {gen_batch_size: 1}
actor_rollout_ref:
  checkpoint_engine: ${oc.select:async_training.checkpoint_engine, null}
  actor:
    use_rollout_log_probs: ${oc.select:async_training.use_rollout_log_probs, True}
"""
"""verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml as the shell recipes below
were written against (verl 0.7: use_rollout_log_probs and compute_prox_log_prob under async_training)."""

VERL_FULLY_ASYNC_CONFIG_0_9 = """
hydra: {searchpath: ["pkg://verl.trainer.config"]}
defaults: [ppo_trainer, _self_]
async_training:
  staleness_threshold: 0.1
  trigger_parameter_sync_step: 4
  require_batches: 1
  partial_rollout: true
  use_trainer_do_validate: false
  use_dynamic_resource_scheduling: false
  dynamic_schedule_policy: default
  dynamic_schedule_deactivate_ratio: 0.3
  dynamic_schedule_enable_rebalance: true
  concurrent_samples_per_replica: 16
rollout: {nnodes: 1, n_gpus_per_node: 8, n: 4, total_rollout_steps: 100}
data: {gen_batch_size: 1}
actor_rollout_ref:
  rollout:
    calculate_log_probs: true
    standalone_gpu_memory_utilization: null
    checkpoint_engine: {backend: nccl}
  actor: {use_rollout_log_probs: true}
  model: {use_remove_padding: true}
algorithm:
  rollout_correction: {bypass_mode: true}
"""
"""The same file in verl 0.9.1: the correction moved to algorithm.rollout_correction.bypass_mode."""

VERL_ONE_STEP_OFF_CONFIG = """
hydra: {searchpath: ["file://verl/trainer/config"]}
defaults: [ppo_trainer, _self_]
rollout: {nnodes: 1, n_gpus_per_node: 8}
actor_rollout_ref:
  rollout:
    free_cache_engine: false
    calculate_log_probs: true
    checkpoint_engine: {backend: nccl}
algorithm:
  rollout_correction: {bypass_mode: true}
"""
"""verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml (verl 0.9.1)."""

_DAPO_7B = [
    "data.train_files=/verl/data/dapo-math-17k.parquet",
    "data.val_files=/verl/data/aime-2024.parquet",
    "data.prompt_key=prompt",
    "data.truncation=left",
    "data.max_prompt_length=2048",
    "data.train_batch_size=0",
    "data.gen_batch_size=1",
    "data.return_raw_chat=True",
    "actor_rollout_ref.rollout.n=16",
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.0",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "critic.strategy=fsdp2",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.hybrid_engine=False",
    "+actor_rollout_ref.model.override_config.max_position_embeddings=32768",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.model.path=/verl/models/Qwen2.5-Math-7B",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
    "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.grad_clip=1.0",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.80",
    "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=async",
    "reward_model.reward_manager=dapo",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
    "trainer.logger=['console','tensorboard']",
    "trainer.project_name=DAPO",
    "trainer.save_freq=-1",
    "trainer.resume_mode=auto",
    "rollout.total_epochs=10",
    "async_training.partial_rollout=True",
    "async_training.use_rollout_log_probs=True",
]
VERL_DAPO_7B_4_4 = [
    *_DAPO_7B,
    "data.max_response_length=8192",
    "+reward_model.reward_kwargs.max_resp_len=8192",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.max_num_batched_tokens=10240",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size=2",
    "trainer.experiment_name=DAPO-Qwen2.5-7b-MATH-0527a1-fsdp2-fully-async-4-4",
    "trainer.val_before_train=False",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=4",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=4",
    "rollout.total_rollout_steps=51200",
    "rollout.test_freq=10",
    "async_training.staleness_threshold=0.1",
    "async_training.trigger_parameter_sync_step=4",
    "async_training.require_batches=4",
]
"""verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_4.sh."""

VERL_DAPO_7B_64_64_MIS = [
    *_DAPO_7B,
    "data.max_response_length=28672",
    "+reward_model.reward_kwargs.max_resp_len=28672",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=61440",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "trainer.experiment_name=dapo_qwen2-7B-math_28k_fsdp2_fully-async_64-64",
    "trainer.nnodes=8",
    "trainer.n_gpus_per_node=8",
    "rollout.nnodes=8",
    "rollout.n_gpus_per_node=8",
    "rollout.total_rollout_steps=204800",
    "rollout.test_freq=20",
    "async_training.staleness_threshold=0.5",
    "async_training.trigger_parameter_sync_step=4",
    "async_training.require_batches=4",
    "async_training.compute_prox_log_prob=True",
    "algorithm.rollout_correction.rollout_is=token",
    "algorithm.rollout_correction.rollout_is_threshold=2.0",
    "+algorithm.rollout_correction.rollout_rs=seq_mean_k1",
    "+algorithm.rollout_correction.rollout_rs_threshold=0.99_1.001",
]
"""verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_64_64_mis.sh (MIS: token TIS plus a
geometric-mean sequence rejection)."""

VERL_RETOOL_ASYNC = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.0",
    "data.train_files=['/data/dataset/BytedTsinghua-SIA/DAPO-Math-17k']",
    "data.val_files=['/data/dataset/yentinglin/aime_2025', '/data/dataset/Maxwell-Jia/AIME_2024']",
    "data.return_raw_chat=True",
    "data.train_batch_size=0",
    "data.max_prompt_length=2048",
    "data.max_response_length=16384",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "+data.custom_cls.path=recipe/retool/retool.py",
    "+data.custom_cls.name=CustomRLHFDataset",
    "+custom_reward_function.path=recipe/retool/retool.py",
    "+custom_reward_function.name=compute_score",
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.model.path=/hdfs/checkpoint/multiturn-sft-qwen-2.5-7b-instruct/global_step_372",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=18432",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "critic.strategy=fsdp2",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size=4",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=async",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "actor_rollout_ref.rollout.multi_turn.enable=True",
    "actor_rollout_ref.rollout.multi_turn.max_user_turns=16",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=16",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path=recipe/retool/sandbox_fusion_tool_config.yaml",
    "actor_rollout_ref.rollout.multi_turn.format=hermes",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
    "actor_rollout_ref.rollout.n=16",
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.6",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.n=30",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "trainer.logger=['console','tensorboard']",
    "trainer.project_name=retool",
    "trainer.experiment_name=qwen2.5-7b_dapo_async_tool",
    "trainer.val_before_train=True",
    "trainer.log_val_generations=20",
    "trainer.save_freq=-1",
    "trainer.default_local_dir=/data/checkpoint/qwen2.5-7b_dapo_async_tool",
    "data.gen_batch_size=1",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=4",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=4",
    "rollout.total_rollout_steps=16000",
    "rollout.total_epochs=10",
    "rollout.test_freq=10",
    "async_training.staleness_threshold=0.5",
    "async_training.trigger_parameter_sync_step=4",
    "async_training.require_batches=1",
    "async_training.partial_rollout=True",
    "async_training.use_rollout_log_probs=True",
]
"""verl/experimental/fully_async_policy/shell/dapo_7b_async_retool.sh (the agent loop with tools)."""

VERL_GRPO_ONE_STEP_OFF = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=/verl/data/gsm8k/train.parquet",
    "data.val_files=/verl/data/gsm8k/test.parquet",
    "data.train_batch_size=1152",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "critic.strategy=fsdp2",
    "actor_rollout_ref.model.path=/verl/models/Qwen3-0.6B",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=192",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.load_format=safetensors",
    "actor_rollout_ref.rollout.layered_summon=True",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.val_before_train=True",
    "trainer.logger=['console','tensorboard']",
    "trainer.project_name=GRPO",
    "trainer.experiment_name=GRPO-Qwen3-0.6b-gsm8k-fsdp2-one-step-off-2-6",
    "trainer.save_freq=-1",
    "trainer.test_freq=5",
    "trainer.total_epochs=2",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=6",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=2",
]
"""verl/experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh (GRPO with a k3 KL loss)."""

VERL_ALGORITHMS = {
    "rloo": [
        "algorithm.adv_estimator=rloo",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_penalty=kl",
        "algorithm.kl_ctrl.kl_coef=0.001",
    ],
    "reinforce_plus_plus": [
        "algorithm.adv_estimator=reinforce_plus_plus",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.kl_loss_type=mse",
        "algorithm.use_kl_in_reward=True",
    ],
    "gspo": [
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.actor.clip_ratio_low=0.0003",
        "actor_rollout_ref.actor.clip_ratio_high=0.0004",
        "actor_rollout_ref.actor.use_kl_loss=False",
    ],
    "cispo": [
        "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
        "actor_rollout_ref.actor.clip_ratio_low=10",
        "actor_rollout_ref.actor.clip_ratio_high=0.2",
    ],
    "grpo_lora": [
        "actor_rollout_ref.model.lora_rank=64",
        "+actor_rollout_ref.model.lora_alpha=32",
        "actor_rollout_ref.actor.optim.lr=3e-6",
    ],
}
"""verl's algorithm examples (examples/rloo_trainer/run_qwen2-7b.sh, reinforce_plus_plus_trainer/
run_qwen2-7b_math_rf.sh, gspo_trainer/test_gspo_3b_math.sh, cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh,
grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh): their algorithm lines, over VERL_GRPO_ONE_STEP_OFF."""

VERL_DEFAULTS = """
algorithm:
  adv_estimator: gae
  gamma: 1.0
  lam: 1.0
  norm_adv_by_std_in_grpo: true
  use_kl_in_reward: false
  kl_penalty: kl
  kl_ctrl: {type: fixed, kl_coef: 0.001, horizon: 10000, target_kl: 0.1}
  rollout_correction: {rollout_is: null, rollout_is_threshold: 2.0, rollout_rs: null, bypass_mode: false}
actor_rollout_ref:
  model: {path: ~/models/deepseek-llm-7b-chat, lora_rank: 0}
  actor:
    strategy: fsdp
    ppo_mini_batch_size: 256
    clip_ratio: 0.2
    clip_ratio_low: 0.2
    clip_ratio_high: 0.2
    policy_loss: {loss_mode: vanilla}
    clip_ratio_c: 3.0
    loss_agg_mode: token-mean
    entropy_coeff: 0
    use_kl_loss: false
    kl_loss_coef: 0.001
    kl_loss_type: low_var_kl
  rollout: {name: vllm, n: 1, tensor_model_parallel_size: 2}
data: {train_files: ~/data/rlhf/gsm8k/train.parquet, train_batch_size: 1024}
trainer: {total_epochs: 30, project_name: verl_examples, experiment_name: gsm8k, logger: [console, wandb]}
"""
"""The algorithm part of verl's _generated_ppo_trainer.yaml: GAE with a critic and one sample."""
