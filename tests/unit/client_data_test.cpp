// The client's JSONL -> streambp.v1.Batch parsing, batching and objective options.
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>

#include "streambp/client/data.h"
#include "streambp/client/result.h"

namespace streambp::client {
namespace {

v1::Batch Parse(const std::string& text, const std::string& kind) {
  std::istringstream in(text);
  return ParseBatchJsonl(in, "d.jsonl", kind);
}

// The ClientError of f ("" when it does not throw), with its code checked.
std::string ErrorOf(const std::function<void()>& f, grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT) {
  try {
    f();
  } catch (const ClientError& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.message();
  }
  return "";
}

std::string ParseError(const std::string& text, const std::string& kind) {
  return ErrorOf([&] { Parse(text, kind); });
}

template <class R>
std::vector<int64_t> Vec(const R& r) {
  return {r.begin(), r.end()};
}

TEST(ClientData, SftBothForms) {
  const auto b = Parse(
      "{\"tokens\": [1, 5, 9, 2], \"loss_mask\": [0, 1, 1, true]}\n"
      "\n"
      "  \n"
      "{\"prompt\": [1, 5], \"completion\": [9, 2, 4]}\n"
      "{\"tokens\": [7, 8]}\n",
      "sft");
  ASSERT_EQ(BatchKind(b), "sft");
  ASSERT_EQ(b.sft().examples_size(), 3);
  const auto& e0 = b.sft().examples(0);
  EXPECT_EQ(Vec(e0.tokens()), (std::vector<int64_t>{1, 5, 9, 2}));
  EXPECT_EQ(Vec(e0.loss_mask()), (std::vector<int64_t>{0, 1, 1, 1}));
  const auto& e1 = b.sft().examples(1);
  EXPECT_TRUE(e1.tokens().empty());
  EXPECT_EQ(Vec(e1.prompt()), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(Vec(e1.completion()), (std::vector<int64_t>{9, 2, 4}));
  EXPECT_TRUE(b.sft().examples(2).loss_mask().empty());

  // The sequence and targets the server sees.
  EXPECT_EQ(SequenceTokens(e1), (std::vector<int32_t>{1, 5, 9, 2, 4}));
  EXPECT_EQ(SequenceTargets(e1), (std::vector<int32_t>{0, 0, 1, 1, 1}));
  EXPECT_EQ(SequenceTargets(b.sft().examples(2)), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(BatchExamples(b), 3);
  EXPECT_EQ(BatchTokens(b), 4 + 5 + 2);
}

TEST(ClientData, SftErrorsNameLineAndField) {
  EXPECT_EQ(ParseError("{\"tokens\":[1,2]}\n{\"tokens\":[1,2],\"loss_mask\":[1]}\n", "sft"),
            "d.jsonl:2: loss_mask has 1 entries but tokens has 2");
  EXPECT_EQ(ParseError("\n\n{\"tokens\":[1,\"x\"]}\n", "sft"), "d.jsonl:3: tokens[1] must be an integer token id, got \"x\"");
  EXPECT_EQ(ParseError("{\"tokens\":[1,-4]}", "sft"), "d.jsonl:1: tokens[1] = -4 is not a token id (must be in [0, 2^31))");
  EXPECT_EQ(ParseError("{\"tokens\":[1,3000000000]}", "sft"),
            "d.jsonl:1: tokens[1] = 3000000000 is not a token id (must be in [0, 2^31))");
  EXPECT_EQ(ParseError("{\"tokens\":[1,2],\"loss_mask\":[0,2]}", "sft"), "d.jsonl:1: loss_mask[1] must be 0 or 1, got 2");
  EXPECT_EQ(ParseError("{\"tokens\":[1],\"labels\":[1]}", "sft"),
            "d.jsonl:1: unknown field 'labels' (with 'tokens' only 'loss_mask' is allowed)");
  EXPECT_EQ(ParseError("{\"prompt\":[1]}", "sft"), "d.jsonl:1: missing field 'completion'");
  EXPECT_EQ(ParseError("{\"prompt\":[1],\"completion\":[]}", "sft"), "d.jsonl:1: field 'completion' is empty");
  EXPECT_EQ(ParseError("{\"tokens\":[]}", "sft"), "d.jsonl:1: field 'tokens' is empty");
  EXPECT_EQ(ParseError("{\"words\":\"hi\"}", "sft"),
            "d.jsonl:1: expected one of the fields 'tokens', 'input_ids', 'text', 'messages', or 'prompt' and "
            "'completion'");
  EXPECT_EQ(ParseError("[1,2]", "sft"), "d.jsonl:1: expected a JSON object");
  EXPECT_EQ(ParseError("{\"tokens\":[1,2]}\n\n", "sft"), "");
  EXPECT_EQ(ParseError("\n \n", "sft"), "d.jsonl: no examples (the file is empty)");
  EXPECT_NE(ParseError("{\"tokens\":[1,2]}\n{\"tokens\":[1,2\n", "sft").find("d.jsonl:2: not valid JSON"),
            std::string::npos);
  EXPECT_EQ(ParseError("{}", "ppo"), "no data format for objective 'ppo' (known: sft, dpo, grpo, weighted)");
}

// TRL's dataset formats and Hugging Face's input_ids + labels.
TEST(ClientData, TrlAndHuggingFaceFormats) {
  const auto b = Parse(
      "{\"text\":\"The quick brown fox.\"}\n"
      "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello\","
      "\"train\":false}]}\n"
      "{\"prompt\":\"2+2=\",\"completion\":\"4\"}\n"
      "{\"prompt\":[{\"role\":\"user\",\"content\":\"2+2?\"}],\"completion\":[{\"role\":\"assistant\",\"content\":\"4\"}]}\n"
      "{\"input_ids\":[5,6,7,8],\"labels\":[-100,-100,7,8],\"attention_mask\":[1,1,1,1]}\n",
      "sft");
  const auto& e = b.sft().examples();
  ASSERT_EQ(e.size(), 5);
  EXPECT_EQ(e[0].text(), "The quick brown fox.");
  ASSERT_EQ(e[1].messages_size(), 2);
  EXPECT_EQ(e[1].messages(1).role(), "assistant");
  EXPECT_TRUE(e[1].messages(1).has_train());
  EXPECT_FALSE(e[1].messages(1).train());
  EXPECT_EQ(e[2].prompt_text().text(), "2+2=");
  EXPECT_EQ(e[2].completion_text().text(), "4");
  EXPECT_EQ(e[3].prompt_text().messages(0).content(), "2+2?");
  EXPECT_EQ(e[3].completion_text().messages(0).role(), "assistant");
  EXPECT_EQ(Vec(e[4].tokens()), (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(SequenceTargets(e[4]), (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_TRUE(BatchHasText(b));
  EXPECT_FALSE(BatchHasText(Parse("{\"tokens\":[1,2]}", "sft")));

  EXPECT_EQ(ParseError("{\"input_ids\":[5,6],\"labels\":[-100,9]}", "sft"),
            "d.jsonl:1: labels[1] = 9 is neither -100 nor input_ids[1]");
  EXPECT_EQ(ParseError("{\"input_ids\":[5,6],\"attention_mask\":[1,0]}", "sft"),
            "d.jsonl:1: attention_mask[1] is not 1: strip padding from examples");
  EXPECT_EQ(ParseError("{\"prompt\":\"a\",\"completion\":[1]}", "sft"),
            "d.jsonl:1: 'prompt' and 'completion' must have the same form (ids, strings or messages)");
  EXPECT_EQ(ParseError("{\"messages\":[{\"role\":\"user\"}]}", "sft"),
            "d.jsonl:1: messages[0]: field 'content' must be a string");
  EXPECT_EQ(ParseError("{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"y\"}]}", "sft"),
            "d.jsonl:1: messages[0]: unknown field 'name' (known: role, content, reasoning_content, train)");
  EXPECT_EQ(ParseError("{\"text\":\"\"}", "sft"), "d.jsonl:1: field 'text' must be a non-empty string");

  const auto d = Parse("{\"prompt\":\"Pick:\",\"chosen\":\"A\",\"rejected\":\"B\"}", "dpo");
  EXPECT_EQ(d.dpo().pairs(0).chosen_text().text(), "A");
  EXPECT_EQ(ParseError("{\"prompt\":\"Pick:\",\"chosen\":\"A\",\"rejected\":[1]}", "dpo"),
            "d.jsonl:1: 'prompt', 'chosen' and 'rejected' must have the same form (ids, strings or messages)");
  const auto g = Parse("{\"prompt\":\"Count:\",\"completions\":[{\"text\":\"1 2 3\",\"reward\":1}]}", "grpo");
  EXPECT_EQ(g.grpo().groups(0).prompt_text().text(), "Count:");
  EXPECT_EQ(g.grpo().groups(0).completions(0).text(), "1 2 3");

  const auto w = Parse("{\"tokens\":[1,2,3],\"weights\":[0.5,-1]}", "weighted");
  ASSERT_EQ(BatchKind(w), "weighted");
  EXPECT_EQ(w.weighted().sequences(0).weights(1), -1.0);
  EXPECT_EQ(ParseError("{\"tokens\":[1,2,3],\"weights\":[0.5]}", "weighted"),
            "d.jsonl:1: weights has 1 entries; it needs 2 (one per token after the first)");
}

TEST(ClientData, Dpo) {
  const auto b = Parse(
      "{\"prompt\":[1,2],\"chosen\":[3,4,5],\"rejected\":[6],\"ref_chosen_logp\":-1.5,\"ref_rejected_logp\":-2}\n"
      "{\"prompt\":[1],\"chosen\":[3],\"rejected\":[6,7]}\n",
      "dpo");
  ASSERT_EQ(BatchKind(b), "dpo");
  ASSERT_EQ(b.dpo().pairs_size(), 2);
  const auto& p = b.dpo().pairs(0);
  EXPECT_EQ(Vec(p.prompt()), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Vec(p.chosen()), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(Vec(p.rejected()), (std::vector<int64_t>{6}));
  ASSERT_TRUE(p.has_ref_chosen_logp());
  EXPECT_EQ(p.ref_chosen_logp(), -1.5);
  EXPECT_EQ(p.ref_rejected_logp(), -2.0);
  EXPECT_FALSE(b.dpo().pairs(1).has_ref_chosen_logp());
  EXPECT_FALSE(b.dpo().pairs(1).has_ref_rejected_logp());
  // prompt+chosen and prompt+rejected.
  EXPECT_EQ(ExampleTokens(b, 0), 5 + 3);
  EXPECT_EQ(ExampleTokens(b, 1), 2 + 3);

  EXPECT_EQ(ParseError("{\"prompt\":[1],\"chosen\":[3],\"rejected\":[6],\"ref_chosen_logp\":-1}", "dpo"),
            "d.jsonl:1: give both ref_chosen_logp and ref_rejected_logp, or neither");
  EXPECT_EQ(ParseError("{\"prompt\":[1],\"chosen\":[3]}", "dpo"), "d.jsonl:1: missing field 'rejected'");
  EXPECT_EQ(ParseError("{\"prompt\":[],\"chosen\":[3],\"rejected\":[4]}", "dpo"),
            "d.jsonl:1: field 'prompt' is empty (a completion needs a token before it)");
  EXPECT_EQ(ParseError("{\"prompt\":[1],\"chosen\":[3],\"rejected\":[4],\"margin\":1}", "dpo"),
            "d.jsonl:1: unknown field 'margin' (known: prompt, chosen, rejected, ref_chosen_logp, ref_rejected_logp)");
  EXPECT_EQ(
      ParseError("{\"prompt\":[1],\"chosen\":[3],\"rejected\":[4],\"ref_chosen_logp\":\"a\",\"ref_rejected_logp\":1}",
                 "dpo"),
      "d.jsonl:1: field 'ref_chosen_logp' must be a number, got \"a\"");
}

TEST(ClientData, Grpo) {
  const auto b = Parse(
      "{\"prompt\":[1,2],\"completions\":[{\"tokens\":[3,4],\"reward\":1.0,\"logprobs\":[-0.5,-0.25]},"
      "{\"tokens\":[5],\"reward\":0}]}\n"
      "{\"prompt\":[9],\"completions\":[{\"tokens\":[3],\"advantages\":[0.5]}]}\n",
      "grpo");
  ASSERT_EQ(BatchKind(b), "grpo");
  ASSERT_EQ(b.grpo().groups_size(), 2);
  const auto& g = b.grpo().groups(0);
  EXPECT_EQ(Vec(g.prompt()), (std::vector<int64_t>{1, 2}));
  ASSERT_EQ(g.completions_size(), 2);
  EXPECT_EQ(g.completions(0).reward(), 1.0);
  ASSERT_EQ(g.completions(0).logprobs_size(), 2);
  EXPECT_FLOAT_EQ(g.completions(0).logprobs(0), -0.5f);
  EXPECT_FLOAT_EQ(g.completions(0).logprobs(1), -0.25f);
  EXPECT_TRUE(g.completions(1).logprobs().empty());
  EXPECT_FLOAT_EQ(b.grpo().groups(1).completions(0).advantages(0), 0.5f);
  EXPECT_EQ(ExampleTokens(b, 0), (2 + 2) + (2 + 1));

  EXPECT_EQ(ParseError("{\"prompt\":[1],\"completions\":[{\"tokens\":[2],\"reward\":1},{\"tokens\":[3]}]}", "grpo"),
            "d.jsonl:1: completions[1]: missing field 'reward'");
  EXPECT_EQ(ParseError("{\"prompt\":[1],\"completions\":[{\"tokens\":[2,3],\"reward\":1,\"logprobs\":[-1]}]}", "grpo"),
            "d.jsonl:1: completions[0]: logprobs has 1 entries but the completion has 2 tokens");
  EXPECT_EQ(ParseError("{\"prompt\":[1],\"completions\":[]}", "grpo"), "d.jsonl:1: field 'completions' is empty");
  EXPECT_EQ(ParseError("{\"prompt\":[1]}", "grpo"), "d.jsonl:1: missing field 'completions' (a list)");
  EXPECT_EQ(ParseError("{\"prompt\":[1],\"completions\":[{\"tokens\":[2],\"reward\":\"high\"}]}", "grpo"),
            "d.jsonl:1: completions[0]: field 'reward' must be a number, got \"high\"");
  EXPECT_EQ(ParseError("{\"prompt\":[1],\"completions\":[{\"tokens\":[2],\"reward\":1,\"score\":1}]}", "grpo"),
            "d.jsonl:1: completions[0]: unknown field 'score' (known: tokens, text, reward, logprobs, advantages)");
  EXPECT_NE(ParseError("{\"prompt\":[1],\"completions\":[{\"tokens\":[2],\"reward\":1e999}]}", "grpo")
                .find("d.jsonl:1: not valid JSON"),
            std::string::npos);
}

TEST(ClientData, ReadFileErrors) {
  EXPECT_EQ(ErrorOf([] { ReadBatchJsonl("/nonexistent/x.jsonl", "sft"); }, grpc::StatusCode::NOT_FOUND),
            "cannot open data file /nonexistent/x.jsonl");
  const auto path = std::filesystem::temp_directory_path() / "streambp_client_data_test.jsonl";
  std::ofstream(path) << "{\"tokens\":[1,2]}\n{\"tokens\":[1,2],\"loss_mask\":[0,1,1]}\n";
  EXPECT_EQ(ErrorOf([&] { ReadBatchJsonl(path.string(), "sft"); }),
            path.string() + ":2: loss_mask has 3 entries but tokens has 2");
  std::filesystem::remove(path);
}

TEST(ClientData, SplitByTokensKeepsGroupsWhole) {
  // Group i: a prompt of 2 tokens and i+1 completions of 2 tokens, so 4(i+1) tokens.
  std::string text;
  for (int i = 0; i < 5; ++i) {
    text += "{\"prompt\":[1,2],\"completions\":[";
    for (int c = 0; c <= i; ++c) text += std::string(c ? "," : "") + "{\"tokens\":[3," + std::to_string(c) + "],\"reward\":" + std::to_string(c) + "}";
    text += "]}\n";
  }
  const auto all = Parse(text, "grpo");
  // Example tokens: 4, 8, 12, 16, 20.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ExampleTokens(all, i), 4 * (i + 1));
  const auto batches = SplitByTokens(all, 13);
  // Greedy: [4, 8] = 12; [12]; [16] alone (over the budget); [20] alone.
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(BatchExamples(batches[0]), 2);
  EXPECT_EQ(BatchTokens(batches[0]), 12);
  EXPECT_EQ(BatchExamples(batches[1]), 1);
  EXPECT_EQ(BatchTokens(batches[2]), 16);
  EXPECT_EQ(BatchTokens(batches[3]), 20);
  // Every group arrives whole, in order.
  int64_t next = 0;
  for (const auto& b : batches) {
    ASSERT_EQ(BatchKind(b), "grpo");
    for (const auto& g : b.grpo().groups()) {
      ASSERT_EQ(g.completions_size(), next + 1);
      for (int c = 0; c < g.completions_size(); ++c) EXPECT_EQ(g.completions(c).reward(), c);
      ++next;
    }
  }
  EXPECT_EQ(next, 5);
  // A budget larger than everything: one batch equal to the input.
  const auto one = SplitByTokens(all, 1 << 20);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].SerializeAsString(), all.SerializeAsString());
  EXPECT_EQ(ErrorOf([&] { SplitByTokens(all, 0); }), "tokens per batch must be > 0, got 0");
}

TEST(ClientData, SplitByTokensDpoPairs) {
  const auto all = Parse(
      "{\"prompt\":[1,2],\"chosen\":[3],\"rejected\":[4]}\n"     // 6 tokens
      "{\"prompt\":[1],\"chosen\":[3,3],\"rejected\":[4]}\n"     // 5 tokens
      "{\"prompt\":[1],\"chosen\":[3],\"rejected\":[4,4,4]}\n",  // 6 tokens
      "dpo");
  const auto batches = SplitByTokens(all, 11);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].dpo().pairs_size(), 2);
  EXPECT_EQ(batches[1].dpo().pairs_size(), 1);
  EXPECT_EQ(batches[1].dpo().pairs(0).rejected_size(), 3);
}

TEST(ClientData, SplitByExamples) {
  const auto all = Parse("{\"tokens\":[1]}\n{\"tokens\":[2]}\n{\"tokens\":[3]}\n{\"tokens\":[4]}\n{\"tokens\":[5]}\n", "sft");
  const auto batches = SplitByExamples(all, 2);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(BatchExamples(batches[0]), 2);
  EXPECT_EQ(BatchExamples(batches[2]), 1);
  EXPECT_EQ(batches[2].sft().examples(0).tokens(0), 5);
}

TEST(ClientData, ObjectiveOptions) {
  const auto dpo = ParseObjectiveOptions("dpo", R"({"beta": 0.25, "loss_type": "ipo"})");
  EXPECT_TRUE(dpo.dpo.has_beta());
  EXPECT_EQ(dpo.dpo.beta(), 0.25);
  EXPECT_EQ(dpo.dpo.loss_type(), "ipo");
  EXPECT_FALSE(dpo.dpo.has_label_smoothing());
  v1::TrainStepRequest request;
  dpo.ApplyTo(&request);
  EXPECT_EQ(request.objective(), "dpo");
  ASSERT_EQ(request.options_case(), v1::TrainStepRequest::kDpo);
  EXPECT_EQ(request.dpo().beta(), 0.25);

  const auto grpo = ParseObjectiveOptions("grpo", R"({"beta":0,"epsilon_high":0.3,"scale_rewards":"none","tis_cap":0})");
  EXPECT_TRUE(grpo.grpo.has_beta());  // an explicit 0 stays explicit
  EXPECT_EQ(grpo.grpo.epsilon_high(), 0.3);
  EXPECT_TRUE(grpo.grpo.has_tis_cap());
  v1::ForwardBackwardRequest fb;
  grpo.ApplyTo(&fb);
  EXPECT_EQ(fb.options_case(), v1::ForwardBackwardRequest::kGrpo);

  const auto sft = ParseObjectiveOptions("sft", "");
  EXPECT_EQ(sft.kind, "sft");
  EXPECT_EQ(ParseObjectiveOptions("sft", R"({"normalizer": 100})").sft.normalizer(), 100.0);

  EXPECT_EQ(ErrorOf([] { ParseObjectiveOptions("dpo", R"({"betta": 1})"); }),
            "objective options: unknown key 'betta' for dpo (known: beta, loss_type, label_smoothing, normalizer)");
  EXPECT_EQ(ErrorOf([] { ParseObjectiveOptions("dpo", R"({"beta": "high"})"); }),
            "objective options: dpo.beta must be a number, got \"high\"");
  EXPECT_EQ(ErrorOf([] { ParseObjectiveOptions("grpo", R"({"loss_type": 3})"); }),
            "objective options: grpo.loss_type must be a string, got 3");
  EXPECT_EQ(ErrorOf([] { ParseObjectiveOptions("sft", "[1]"); }), "objective options must be a JSON object, got [1]");
  EXPECT_NE(ErrorOf([] { ParseObjectiveOptions("sft", "{"); }).find("objective options are not valid JSON"),
            std::string::npos);
}

}  // namespace
}  // namespace streambp::client
