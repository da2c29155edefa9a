"""Episodes: turning turns into one trajectory (chat template, tool calls, masks, versions, why it
ended). Used by the rollout's agent loop (``loop``) and meant for the agent gateway as well, so that
one recorder serves both: ``recorder`` (the trajectory's arrays), ``chat`` (prompt and between-turn
tokens from the model's chat template), ``tools`` (schemas and calls), ``parser`` (tool calls from
generated text, through vLLM's tool parsers)."""
