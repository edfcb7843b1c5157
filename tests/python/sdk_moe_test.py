#!/usr/bin/env python3
"""Mixture of experts through the Python SDK against a real server (the tiny qwen3_moe
preset, float64): Sample returns the experts every token was routed to, packed; a GRPO step
and a rollout step given them (rollout_group carries them) replay them, and no replayed
decision differs from the router's (every id survived the round trip); an altered id
changes the step (the replay is what trains); malformed routing is INVALID_ARGUMENT naming
the field, nothing trained; the load-balancing loss asked per request adds its metric; a LoRA
session trains the router only when modules_to_save asks for it.

    sdk_moe_test.py <streambp-server>
"""
import json
import os
import sys
import tempfile
import time

from sdk_util import check, close, expect_error, start

import grpc

import streambp
from streambp import pb

PROMPTS = [[7, 8, 9, 10, 11], [12, 13]]
TMP = tempfile.mkdtemp(prefix="sdk-moe-")


def grpo_batch(prompt, completions, rewards):
    """A GRPO batch of one group from sampled completions, their routing included."""
    group = streambp.rollout_group(prompt, completions, rewards, policy_version=0, group_id="g")
    return pb.Batch(grpo=pb.GrpoBatch(groups=[pb.GrpoGroup(prompt=prompt, completions=group.completions)]))


def main() -> int:
    server_bin = sys.argv[1]
    t0 = time.time()
    config = {"log": {"level": "warn"}, "rollouts": {"groups_per_step": 2}}
    model = ("--preset", "tiny", "--family", "qwen3_moe", "--dtype", "float64")
    sessions = {"log": {"level": "warn"}, "checkpoint_dir": os.path.join(TMP, "checkpoints"),
                "sessions": {"enabled": True, "max_sessions": 4}}
    server, session_server = start(server_bin, ("moe", config, model + ("--optimizer", "sgd", "--lr", "0.05")),
                                   ("moe-sessions", sessions, model))
    with streambp.ServiceClient(server.target) as service:
        service.wait_ready(60)
        tc = service.training_client()

        # Sample with the routing: per token of prompt + completion, per sparse layer, k ids.
        out = tc.sample(PROMPTS, n=2, max_tokens=6, seed=4, return_routed_experts=True)
        for c in out.completions:
            r = c.routed_experts
            check(r is not None and r.bytes_per_id == 1 and r.experts_per_token == 2 and r.sparse_layers > 0,
                  f"routed_experts: {r}")
            tokens = len(PROMPTS[c.prompt_index]) + len(c.tokens)
            per_token = r.per_token()
            check(len(per_token) == tokens, f"{len(per_token)} tokens of routing for {tokens} tokens")
            check(all(len(set(slots)) == 2 and all(0 <= e < 8 for e in slots)
                      for layers in per_token[:-1] for slots in layers), f"distinct ids in [0, 8): {per_token}")
            check(all(e == -1 for slots in per_token[-1] for e in slots), "the last token (never fed) is -1")
        plain = tc.sample(PROMPTS, n=2, max_tokens=6, seed=4)
        check(all(c.routed_experts is None for c in plain.completions), "routing only when asked")
        check([c.tokens for c in plain.completions] == [c.tokens for c in out.completions], "the same samples")

        # A GRPO step replaying it: every decision the router's own (same weights, float64).
        batch = grpo_batch(PROMPTS[0], out.for_prompt(0), [1.0, 0.0])
        fb = tc.forward_backward(batch)
        check(fb.stats.metrics.get("routing_mismatch") == 0.0, f"replayed routing: {fb.stats.metrics}")

        # An altered id (token 0, first sparse layer, slot 0) routes to another expert: the step
        # reports the differing decision and the policy's token entropies change with it.
        altered = pb.Batch()
        altered.CopyFrom(batch)
        routed = altered.grpo.groups[0].completions[0].routed_experts
        ids = bytearray(routed.ids)
        ids[0] = next(e for e in range(8) if e not in (ids[0], ids[1]))
        routed.ids = bytes(ids)
        other = tc.forward_backward(altered)
        check(other.stats.metrics.get("routing_mismatch", 0) > 0, f"altered routing: {other.stats.metrics}")
        check(not close(other.stats.metrics["entropy"], fb.stats.metrics["entropy"], 1e-12),
              f"the altered replay is what runs: {other.stats.metrics} vs {fb.stats.metrics}")

        # Malformed routing: INVALID_ARGUMENT naming the field; the policy does not move.
        version = tc.info().policy_version
        for edit, contains in [
                (lambda r: setattr(r, "ids", r.ids[:-1]), "routed_experts has"),
                (lambda r: setattr(r, "bytes_per_id", 3), "bytes_per_id must be 1 or 2"),
                (lambda r: setattr(r, "experts_per_token", 3), "experts per token; this model routes"),
                (lambda r: setattr(r, "ids", bytes([9]) + r.ids[1:]), "expert id 9 is outside [0, 8)"),
                (lambda r: setattr(r, "ids", bytes([r.ids[1]]) + r.ids[1:]), "is named twice"),
                (lambda r: setattr(r, "ids", bytes([255]) + r.ids[1:]), "all given or all -1")]:
            bad = pb.Batch()
            bad.CopyFrom(batch)
            edit(bad.grpo.groups[0].completions[1].routed_experts)
            expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step, bad,
                         contains="batch.grpo.groups[0].completions[1].routed_experts")
            expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step, bad, contains=contains)
        check(tc.info().policy_version == version, "nothing trained")

        # Rollouts carry it: the rollout step replays every decision.
        tc.optim_step()  # the steps above leave gradients: applied, then sampled anew
        fresh = tc.sample(PROMPTS, n=2, max_tokens=5, seed=9, return_routed_experts=True)
        groups = [streambp.rollout_group(p, fresh.for_prompt(i), [1.0, -1.0], fresh.policy_version)
                  for i, p in enumerate(PROMPTS)]
        broken = pb.RolloutGroup()
        broken.CopyFrom(groups[0])
        broken.group_id = "broken"
        broken.completions[1].routed_experts.ids = broken.completions[1].routed_experts.ids[:-2]
        broken.completions[0].routed_experts.bytes_per_id = 4
        (ack,) = tc.push_rollouts([broken])
        check(ack.status == "invalid" and "groups[0].completions[0].routed_experts.bytes_per_id" in ack.message,
              f"a malformed rollout: {ack}")
        broken.completions[0].routed_experts.bytes_per_id = 1
        (ack,) = tc.push_rollouts([broken])
        check(ack.status == "invalid" and "groups[0].completions[1].routed_experts has" in ack.message,
              f"a malformed rollout: {ack}")
        with tc.watch_policy(since_version=tc.info().policy_version, timeout=120) as updates:
            acks = tc.push_rollouts(groups)
            check([a.status for a in acks] == ["accepted", "accepted"], f"PushRollouts: {acks}")
            step = next((u for u in updates if u.source == "rollouts"), None)
        check(step is not None and step.groups_consumed == 2, f"a rollout step: {step}")
        check(step.metrics.get("routing_mismatch") == 0.0, f"the rollout step replayed: {step.metrics}")

        # The load-balancing loss per request (config.json leaves it off): its metric and a larger loss.
        with_aux = tc.forward_backward(batch, engine={"router_aux_loss_coef": 0.5})
        without = tc.forward_backward(batch, engine={"router_aux_loss_coef": 0})
        aux = with_aux.stats.metrics.get("router_aux_loss", 0)
        check(aux > 0 and "router_aux_loss" not in without.stats.metrics, f"aux metric: {with_aux.stats.metrics}")
        check(close(with_aux.loss - without.loss, 0.5 * aux, 1e-9), f"loss + 0.5 aux: {with_aux.loss} {without.loss}")
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.forward_backward, batch,
                     engine={"router_aux_loss_coef": -1}, contains="router_aux_loss_coef must be a finite number >= 0")

    # LoRA sessions: the router frozen unless modules_to_save asks for it (a full copy of every
    # sparse layer's mlp.gate in the adapter, under PEFT's names, and trained).
    lora = {"r": 2, "target_modules": ["q_proj"]}
    optimizer = {"optimizer": {"name": "sgd", "lr": 0.5}}
    with streambp.ServiceClient(session_server.target) as service:
        service.wait_ready(60)
        frozen = service.create_session("frozen", lora=lora, training=optimizer)
        routed = service.create_session("router", lora={**lora, "modules_to_save": ["gate"]}, training=optimizer)
        check(frozen.lora.modules_to_save == [] and routed.lora.modules_to_save == ["gate"], f"sessions: {routed}")
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, service.create_session, "bad",
                     lora={**lora, "modules_to_save": ["lm_head"]}, contains="modules_to_save has 'lm_head'")

        def adapter(session, name):
            folder = os.path.join(TMP, name)
            service.training_client(session).export_adapter(folder)
            with open(os.path.join(folder, "adapter_config.json")) as f:
                config = json.load(f)
            return config, streambp.load_safetensors(os.path.join(folder, "adapter_model.safetensors"))

        config, before = adapter("router", "router-0")
        routers = sorted(n for n in before if n.endswith(".mlp.gate.weight"))
        check(config.get("modules_to_save") == ["gate"], f"adapter_config.json: {config}")
        check(routers and all(n.startswith("base_model.model.model.layers.") for n in routers), f"names: {routers}")
        check(routed.trainable_parameters - frozen.trainable_parameters == sum(before[n].numel for n in routers),
              f"trainable parameters: {routed.trainable_parameters} vs {frozen.trainable_parameters}")
        frozen_config, frozen_tensors = adapter("frozen", "frozen-0")
        check(frozen_config.get("modules_to_save") is None and not any(".mlp.gate." in n for n in frozen_tensors),
              f"frozen router: {frozen_config}")
        service.training_client("router").train_step(streambp.sft_batch([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12]]))
        _, after = adapter("router", "router-1")
        check(all(after[n].values != before[n].values for n in routers), "every router copy trained")
    print(f"sdk_moe: routing replay over the wire, the aux loss per request and the router under LoRA ok "
          f"({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
