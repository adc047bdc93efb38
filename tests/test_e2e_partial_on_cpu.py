"""Partial rollout on the real entry point: long-tail and multi-turn tool use at staleness 2, a replica lost
mid-conversation, a resume with the generation-bound profile's cheap training.

Two launches (a minute or two each on 2 cores), on vLLM's CPU build through verl's vLLM path (the profiles'
``scheduling_policy=priority``: the batches in flight oldest first), on ``one_step_off_ppo_cpu_long_tail`` with an
agentic half:
every batch holds 2 long-tail prompts of 200 to 480 tokens (so each sync lands while they generate) and 2
prompts of the tool-use task (``demo/tool_task.py``: the model calls the
demo's tool through verl's tool agent loop, then answers), 4 samples each, by the tool-use model:

- 6 steps, partial rollout, staleness 2, two replicas in an elastic pool, one killed between the
  turns of a conversation (the 8th tool call: batch 2's conversations and the long tail of batch 1 are
  running), a checkpoint at step 3. The run finishes; every step trains its dataloader batch, the trainer
  checked the version of every token of every turn against [k-1-s, k-1]; some samples span versions; the
  conversation whose replica died continued on the survivor and ended correctly;
- resumed from that step-3 checkpoint by path, weights moving through files (the ``checkpoint`` engine, the
  other weight-sync backend partial rollout supports on CPU), training as ``one_step_off_ppo_cpu_generation_bound``
  (the partial-rollout benchmark's profile) does: verl's bypass mode (the rollout's log-probs as the old ones,
  no recomputation) and dynamic micro-batches. Steps 4-6 train the same prompts as the first run (the batches
  in flight at the checkpoint are regenerated from their prompts), within the same bounds. What else that
  profile sets is checked before Ray starts (test_benchmarks_on_cpu.py).
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from e2e import checkpoint_engine, contract_version, run_main
from faults import failing_conversation, killed_conversation

from recipe.one_step_off_async.async_config import DECOUPLED_OVERRIDES
from recipe.one_step_off_async.demo import long_tail, task, tool_task
from recipe.one_step_off_async.elastic.client import SERVED_BY
from recipe.one_step_off_async.rollout.partial import VERSION_RUNS

pytestmark = pytest.mark.e2e

PROFILE = "one_step_off_ppo_cpu_long_tail"
STEPS, STALENESS, SAVED_AT = 6, 2, 3
SAMPLES_PER_BATCH = 4 * 4  # data.train_batch_size x rollout.n of the long-tail profile
PARTIAL = (
    f"async_training.staleness={STALENESS}",
    "async_training.partial_rollout=true",
    f"trainer.total_training_steps={STEPS}",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    f"trainer.save_freq={SAVED_AT}",
    "data.shuffle=false",  # the mixed file's order: 2 long-tail and 2 tool-use prompts per batch
    "actor_rollout_ref.rollout.multi_turn.enable=true",
    "actor_rollout_ref.rollout.multi_turn.format=hermes",
)
LONG_BUDGET = 200
TOOL_ROW_INDEX = 1_000_000  # the tool-use rows' extra_info.index, after the long-tail rows'


TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)  # verl's hermes parser's pattern
TOOL_TURN = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>\n<\|im_start\|>assistant\n", re.DOTALL)
NEXT_ASSISTANT_TURN = "\nassistant\n"  # in a dumped response (special tokens dropped)


def parsed_call(call: str) -> tuple[object, object] | None:
    """(name, arguments) of a call verl's hermes parser accepts (``HermesToolParser.extract_tool_calls``), else None."""
    try:
        parsed = json.loads(call)
        return parsed["name"], parsed["arguments"]
    except (ValueError, KeyError, TypeError):
        return None


def sort_letters_argument(call: str) -> str | None:
    """The ``letters`` of a call the demo's tool runs on, else None (a malformed or misspelt call, other arguments)."""
    parsed = parsed_call(call)
    if parsed is None or parsed[0] != tool_task.TOOL_NAME or not isinstance(parsed[1], dict):
        return None
    letters = parsed[1].get("letters")
    return letters if set(parsed[1]) == {"letters"} and isinstance(letters, str) else None


def tool_turns(response: str) -> list[tuple[str, str]]:
    """(call, rest of the turn) of each assistant turn of a dumped response whose tool call verl ran.

    verl runs the first call of a turn that its parser accepts (``multi_turn.max_parallel_calls`` is 1), and
    only when the conversation goes on: a turn another assistant turn follows (the last turn's call, if any,
    met the response length or the turn limit).
    """
    *continued, _last = response.split(NEXT_ASSISTANT_TURN)
    turns = []
    for turn in continued:
        accepted = [call for call in TOOL_CALL.finditer(turn) if parsed_call(call.group(1)) is not None]
        if accepted:
            turns.append((accepted[0].group(1), turn[accepted[0].end() :]))
    return turns


def mixed_task(directory, demo_assets) -> tuple[str, ...]:
    """Overrides for the mixed long-tail and tool-use data, the tool and the tool-use model."""
    # Long-tail rows of at least LONG_BUDGET tokens: every batch's long samples outlast a training step, so
    # the syncs after steps 1-4 land while they generate, however fast this machine trains.
    long_rows = [
        row
        for row in pq.read_table(demo_assets.long_tail_train_file).to_pylist()
        if row["extra_info"]["response_budget"] >= LONG_BUDGET
    ]
    tool_rows = pq.read_table(demo_assets.tool_train_file).to_pylist()
    rows = []
    for start in range(0, 64, 2):  # 32 batches
        rows += long_rows[start : start + 2]
        rows += [
            row | {"extra_info": row["extra_info"] | {"index": TOOL_ROW_INDEX + row["extra_info"]["index"]}}
            for row in tool_rows[start : start + 2]
        ]
    path = directory / "mixed_train.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=long_tail.ROW_SCHEMA), path)
    return (
        f"data.train_files={path}",
        f"data.max_prompt_length={task.MAX_PROMPT_LENGTH}",  # the sort prompts are the longer ones
        f"actor_rollout_ref.model.path={demo_assets.tool_model_dir}",
        f"actor_rollout_ref.rollout.multi_turn.function_tool_path={demo_assets.tool_function_path}",
    )


# The generation-bound profile's cheap training (``one_step_off_ppo_cpu_generation_bound``), for the resume.
GENERATION_BOUND_TRAINING = (
    "algorithm.rollout_correction.bypass_mode=true",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024",
)


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory, demo_assets):
    directory = tmp_path_factory.mktemp("partial")
    overrides, env = failing_conversation(directory, kill_at_tool_call=8)
    return run_main(
        directory,
        *PARTIAL,
        *mixed_task(directory, demo_assets),
        "async_training.elastic.enable=true",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",
        *DECOUPLED_OVERRIDES,  # old log-probs recomputed at every step; the resume from it runs in the profiles' bypass mode
        *overrides,
        env=env,
        profile=PROFILE,
    )


def assert_tokens_within_the_contract(metrics: dict[int, dict], steps: range, start: int = 0) -> None:
    assert sorted(metrics) == list(steps), sorted(metrics)
    for step, values in metrics.items():
        # The trainer failed the run on any token outside [w(k), k-1]; what it measured agrees.
        bound = step - 1 - contract_version(step, STALENESS, 1, start)
        assert 0 <= values["async/staleness_min"] <= values["async/staleness_mean"] <= values["async/staleness_max"]
        assert values["async/staleness_max"] <= bound, f"step {step}"
        assert values["async/version_span_max"] <= bound
        assert values["async/staleness"] == values["async/staleness_max"]


def test_partial_run_spans_versions_within_the_contract_and_survives_a_lost_replica(partial_run):
    assert partial_run.returncode == 0, partial_run.output[-5000:]
    metrics = partial_run.metrics
    assert_tokens_within_the_contract(metrics, range(1, STEPS + 1))
    # Syncs interrupted running samples, which continued under the new weights; the interruption (verl's abort
    # barrier on vLLM: every admitted request has produced a token) is timed in each sync's breakdown.
    assert max(values["async/partial_ratio"] for values in metrics.values()) > 0
    assert all(0 < values["timing_s/sync/abort"] < values["timing_s/sync/total"] for values in metrics.values())
    assert sum(values["async/recomputed_prefill_tokens"] for values in metrics.values()) > 0
    # The replica killed mid-generation: its requests were generated again, every sample of every batch served.
    assert sum(values["async/regenerated_requests"] for values in metrics.values()) > 0
    assert metrics[STEPS]["async/rollout_replicas_lost"] == 1.0
    for step, values in metrics.items():
        served = sum(count for key, count in values.items() if key.startswith("async/replica_requests/"))
        assert served == SAMPLES_PER_BATCH, f"step {step}"
    # The engines' own counters reached the trainer (vLLM's scheduler statistics).
    occupancy = [values["rollout/slot_occupancy"] for values in metrics.values()]
    assert all(0 <= value <= 1 for value in occupancy) and max(occupancy) > 0
    assert sum(values["rollout/prefill_tokens"] for values in metrics.values()) > 0


def test_conversations_ran_several_turns_and_the_one_whose_replica_died_ended_correctly(partial_run):
    assert partial_run.returncode == 0, partial_run.output[-5000:]
    # user, tool call, tool response, answer: verl counts 4 turns.
    assert max(values["num_turns/max"] for values in partial_run.metrics.values()) >= 4
    conversation = killed_conversation(partial_run.directory)
    # The killed replica's vLLM engine process (a child of its server actor, holding the device's memory on a GPU)
    # ended with it: none outlives the replica to fail the next one's free-memory check.
    engines = conversation["engines"]
    assert len(engines["engines"]) == 1 and engines["alive"] == [] and engines["ended_within_s"] < 10, engines
    # The tool call ran on the replica killed after it; the answer on the survivor (sent there at once, or
    # sent again after reaching the dead replica before the pool dropped it).
    first, *_, last = conversation["turn_replicas"]
    assert conversation["turns"] == 2 and first == conversation["killed_replica"] != last, conversation
    fields = conversation["extra_fields"]
    assert fields[SERVED_BY] == last
    # Every model token of both turns carries its version; the trainer checked them against the contract.
    assert sum(n_tokens for _, n_tokens in fields[VERSION_RUNS]) == sum(conversation["response_mask"])
    # verl ran a call of the first turn (the fault fires as it does) and answered it in a tool turn; the answer
    # turn has tokens. What the policy wrote is sampled: a call with the tool's own argument is answered with the
    # tool's result, a misspelt one with verl's error message (not asserted).
    response = conversation["response"]
    tool_turn = TOOL_TURN.search(response)
    assert tool_turn, response
    accepted = [call for call in TOOL_CALL.findall(response[: tool_turn.start()]) if parsed_call(call) is not None]
    assert accepted, response
    letters = sort_letters_argument(accepted[0])
    assert letters is None or tool_turn.group(1) == "".join(sorted(letters)), response
    assert response[tool_turn.end() :], response
    # Every well-formed tool call in the dumps was answered by the tool with the sorted letters.
    calls = 0
    for step in range(1, STEPS + 1):
        for response in partial_run.responses(step):
            for call, rest_of_turn in tool_turns(response):
                letters = sort_letters_argument(call)
                if letters is None:
                    continue  # a misspelt tool or other arguments: verl answered with the tool's error
                calls += 1
                # The tool's turn ends the assistant's (special tokens are not in the dump).
                assert rest_of_turn.endswith(f"\ntool\n{''.join(sorted(letters))}"), response
    # The tools ran: 2 tool-use prompts x 4 samples per step, of which the model calls the tool exactly right in
    # about half (0.56 of 64 val prompts sampled at temperature 1).
    # None of the 12 prompts getting one exact call in 4 samples: even if a prompt's 4 samples all fail together
    # 1 time in 5 (far above the 0.44^4 = 0.04 of independent samples), 0.2^12 = 4e-9. A run whose tools never
    # ran counts none.
    assert calls >= 1, calls


def test_partial_run_resumed_from_a_checkpoint_trains_the_same_prompts_per_step(partial_run, tmp_path, demo_assets):
    checkpoint = partial_run.directory / "checkpoints" / f"global_step_{SAVED_AT}"
    resume = ("trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}")
    task = mixed_task(tmp_path, demo_assets)
    resumed = run_main(
        tmp_path,
        *PARTIAL,
        *task,
        *resume,
        *checkpoint_engine(tmp_path / "weights"),
        *GENERATION_BOUND_TRAINING,
        profile=PROFILE,
    )
    assert resumed.returncode == 0, resumed.output[-5000:]
    assert_tokens_within_the_contract(resumed.metrics, range(SAVED_AT + 1, STEPS + 1), start=SAVED_AT)
    for values in resumed.metrics.values():
        assert values["checkpoint_engine/files"] >= 1
        # Bypass mode: no forward recomputes the old log-probs (the first run's steps do), the actor still updates.
        assert "timing_s/old_log_prob" not in values and values["timing_s/update_actor"] > 0, sorted(values)
    assert all("timing_s/old_log_prob" in values for values in partial_run.metrics.values())
    for step in range(SAVED_AT + 1, STEPS + 1):
        assert Counter(resumed.prompts(step)) == Counter(partial_run.prompts(step)), f"step {step}"
