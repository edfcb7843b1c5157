// Batches in every layout, their masks, validation of sequences, and the JSONL format.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "streambp/batch.h"
#include "streambp/data.h"
#include "streambp/error.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::ErrorOf;

std::vector<int64_t> Row(const torch::Tensor& t, int64_t r) {
  auto c = t[r].contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(Batch, RightAndLeftPadding) {
  std::vector<Sequence> seqs{{{5, 6, 7, 8}, {}}, {{9, 10}, {0, 1}}};
  auto right = MakeBatch(seqs, Layout::kRightPad);
  EXPECT_EQ(Row(right.input_ids, 1), (std::vector<int64_t>{9, 10, 0, 0}));
  EXPECT_EQ(Row(right.position_ids, 1), (std::vector<int64_t>{0, 1, 0, 0}));
  EXPECT_EQ(Row(right.sequence_ids, 1), (std::vector<int64_t>{1, 1, -1, -1}));
  EXPECT_EQ(Row(right.targets, 0), (std::vector<int64_t>{6, 7, 8, 0}));
  auto left = MakeBatch(seqs, Layout::kLeftPad);
  EXPECT_EQ(Row(left.input_ids, 1), (std::vector<int64_t>{0, 0, 9, 10}));
  EXPECT_EQ(Row(left.position_ids, 1), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(Row(left.sequence_ids, 1), (std::vector<int64_t>{-1, -1, 1, 1}));
  // Position 2 of row 1 predicts token 10 (loss_mask[1] = 1); nothing else in that row.
  EXPECT_TRUE(left.target_mask[1][2].item<bool>());
  EXPECT_EQ(left.target_mask[1].sum().item<int64_t>(), 1);
  EXPECT_EQ(left.num_targets(), 4);
}

TEST(Batch, PackingKeepsDocumentsApart) {
  std::vector<Sequence> seqs{{{1, 2, 3}, {}}, {{4, 5}, {}}, {{6, 7, 8, 9}, {}}};
  auto b = MakeBatch(seqs, Layout::kPacked, 5);
  ASSERT_EQ(b.rows(), 2);
  EXPECT_EQ(Row(b.input_ids, 0), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(Row(b.position_ids, 0), (std::vector<int64_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(Row(b.sequence_ids, 0), (std::vector<int64_t>{0, 0, 0, 1, 1}));
  // The last token of a document does not predict the first of the next one.
  EXPECT_FALSE(b.target_mask[0][2].item<bool>());
  auto mask = AttentionMask(b, 0, 5, 5);
  EXPECT_TRUE(mask[0][4][3].item<bool>());
  EXPECT_FALSE(mask[0][3][2].item<bool>());  // document 1 does not see document 0
  EXPECT_FALSE(mask[0][1][2].item<bool>());  // causal
  EXPECT_THROW(MakeBatch(seqs, Layout::kPacked, 3), InvalidArgument);
}

// Batch::whole_rows (what lets CUDA run a chunk in the flash kernel without reading the
// device) against its definition over the sequence ids: each row one sequence from position 0,
// padding only after it.
bool WholeRowsOf(const torch::Tensor& seq) {
  auto first = seq.select(1, 0).unsqueeze(1);
  auto pad = (seq < 0).to(torch::kInt32);
  const bool one = ((seq == first) | (seq < 0)).all().item<bool>() && (first >= 0).all().item<bool>();
  return one && (pad.size(1) < 2 || (pad.slice(1, 1) >= pad.slice(1, 0, -1)).all().item<bool>());
}

TEST(Batch, WholeRowsIsKnownFromTheLayout) {
  int checked_true = 0, checked_false = 0;
  for (const auto& lengths : std::vector<std::vector<int64_t>>{{4}, {4, 4}, {4, 2}, {2, 4, 3}, {3, 3, 3}, {1}}) {
    const auto seqs = testing::RandomSequences(lengths, 50, 7);
    for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
      for (int64_t pack : {int64_t{0}, int64_t{8}}) {
        if (pack > 0 && layout != Layout::kPacked) continue;
        const auto b = MakeBatch(seqs, layout, pack);
        EXPECT_EQ(b.whole_rows, WholeRowsOf(b.sequence_ids)) << b.sequence_ids;
        (b.whole_rows ? checked_true : checked_false)++;
        EXPECT_EQ(AttentionPattern::Causal(b, 0, 1, 1).whole_rows, b.whole_rows);
        EXPECT_EQ(b.to(torch::kCPU).whole_rows, b.whole_rows);
      }
    }
  }
  EXPECT_GE(checked_true, 5);
  EXPECT_GE(checked_false, 3);
  EXPECT_FALSE(Batch{}.whole_rows);  // built by hand: unknown, so the tiled kernel runs
}

TEST(Batch, ChunkMasksAreSlicesOfTheFullMask) {
  auto b = MakeBatch(testing::RandomSequences({7, 3, 5}, 50, 1), Layout::kPacked, 10);
  auto full = AttentionMask(b, 0, 10, 10, 3);
  for (int64_t s = 0; s < 10; s += 4) {
    const int64_t e = std::min<int64_t>(10, s + 4);
    EXPECT_TRUE(torch::equal(AttentionMask(b, s, e, e, 3), full.slice(1, s, e).slice(2, 0, e)));
    // keys at or after e are never needed by queries before e
    EXPECT_FALSE(full.slice(1, s, e).slice(2, e).any().item<bool>());
  }
}

TEST(Batch, ValidationNamesTheProblem) {
  EXPECT_NE(ErrorOf([] { ValidateSequences({}, 10); }).find("batch is empty"), std::string::npos);
  EXPECT_NE(ErrorOf([] { ValidateSequences({{{}, {}}}, 10); }).find("sequence 0: tokens is empty"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { ValidateSequences({{{1, 2}, {}}, {{1, 10}, {}}}, 10); })
                .find("sequence 1: tokens[1] = 10 is outside the vocabulary [0, 10)"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { ValidateSequences({{{1, -1}, {}}}, 10); }).find("tokens[1] = -1"), std::string::npos);
  EXPECT_NE(ErrorOf([] { ValidateSequences({{{1, 2, 3}, {1, 1}}}, 10); })
                .find("loss_mask has 2 entries but tokens has 3"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { ValidateSequences({{{1, 2, 3}, {}}}, 10, 2); }).find("maximum sequence length 2"),
            std::string::npos);
  EXPECT_NO_THROW(ValidateSequences({{{1, 2, 3}, {0, 1, 1}}}, 10));
  EXPECT_THROW(MakeBatch({}, Layout::kRightPad), InvalidArgument);
}

class Jsonl : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    path_ = testing::TempDir("jsonl") + "/data.jsonl";
    std::ofstream(path_) << text;
    return path_;
  }
  void TearDown() override {
    if (!path_.empty()) std::filesystem::remove_all(std::filesystem::path(path_).parent_path());
  }
  std::string path_;
};

TEST_F(Jsonl, ReadsBothFormats) {
  auto seqs = ReadSftJsonl(Write(
      "{\"tokens\":[1,2,3],\"loss_mask\":[0,1,1]}\n\n{\"prompt\":[4,5],\"completion\":[6]}\n{\"tokens\":[7,8]}\n"));
  ASSERT_EQ(seqs.size(), 3u);
  EXPECT_EQ(seqs[0].loss_mask, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(seqs[1].tokens, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(seqs[1].loss_mask, (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_TRUE(seqs[2].loss_mask.empty());
}

TEST_F(Jsonl, ErrorsNameLineAndField) {
  auto check = [&](const std::string& text, const std::string& expected) {
    auto msg = ErrorOf([&] { ReadSftJsonl(Write(text)); });
    EXPECT_NE(msg.find(expected), std::string::npos) << "got: " << msg;
  };
  check("{\"tokens\":[1,2]}\n{\"tokens\":[1,\"a\"]}\n", "data.jsonl:2: tokens[1] must be an integer");
  check("{\"tokens\":[1,2]}\nnot json\n", "data.jsonl:2: not valid JSON");
  check("{\"tokens\":[1,2],\"loss_mask\":[1]}\n", "data.jsonl:1: loss_mask has 1 entries but tokens has 2");
  check("{\"tokens\":[1,2],\"loss_mask\":[1,2]}\n", "loss_mask[1] must be 0 or 1");
  check("{\"tokens\":[]}\n", "data.jsonl:1: field 'tokens' is empty");
  check("{\"prompt\":[1]}\n", "missing field 'completion'");
  check("{\"text\":\"hi\"}\n", "expected a field 'tokens'");
  check("{\"tokens\":[1],\"labels\":[1]}\n", "unknown field 'labels'");
  check("", "no examples");
  EXPECT_THROW(ReadSftJsonl("/nonexistent.jsonl"), NotFound);
}

}  // namespace
}  // namespace streambp
