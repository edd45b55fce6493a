#pragma once
// `s3r data prepare`: text -> SentencePiece BPE tokenizer -> train and validation
// token shards.
//
// Inputs: files or folders of text, JSON(L) or these gzip-compressed, read into documents as
// s3r/data/text_input.hpp describes (read_documents). In a folder, OUT itself and its temporary
// siblings (when OUT lies inside an input folder) are skipped with a warning, like any file that is
// not a known text format.
//
// A tokenizer is trained on the input unless `tokenizer_model` names an existing SentencePiece
// model (such as Llama's tokenizer.model; it may be OUT/tokenizer.model itself). The trained
// tokenizer uses byte fallback, so --vocab must be at least 260 (256 byte pieces, <unk>, the
// end-of-text piece, and at least the word-start piece and one character) plus one piece per
// further distinct character of the text, and at most 1048576; SentencePiece's own limits (too
// small or too large for the text) come back as plain messages with the size that would work. The
// tokenizer learns from each line of the documents, lines longer than 4000 bytes cut at a space
// (SentencePiece would drop them). Every document is encoded and followed by the end-of-text id;
// the last `val_fraction` of the documents (in input order) forms the validation shard. The same
// inputs and options give byte-identical output.
//
// Output, all or nothing. OUT receives tokenizer.model, tokenizer.vocab (when trained: each piece
// and its score, one a line), train.bin, val.bin and info.json. Everything is written into the
// sibling folder OUT.tmp-<pid>, verified (the shards re-read and checked against the token counts
// and the tokenizer's vocabulary, info.json re-read), fsynced, and only then swapped in: with
// renameat2(RENAME_EXCHANGE) where the file system has it (one atomic step; the old dataset, now in
// OUT.tmp-<pid>, is then removed), else by OUT -> OUT.old-<pid>, OUT.tmp-<pid> -> OUT, removing
// OUT.old-<pid>; the parent folder is fsynced after. So a failure or a kill at any moment before
// the swap leaves an existing OUT exactly as it was, and after it OUT is the complete new dataset
// (on the two-rename path a kill between the renames leaves the old one under OUT.old-<pid>, and
// the next prepare into OUT moves it back first). Leftovers of a killed run (OUT.tmp-<pid> and
// OUT.old-<pid> whose process <pid> is gone) are cleaned up at the start of the next prepare into
// the same OUT.
//
// OUT may be replaced only when it is missing, an empty folder, or a folder holding nothing but the
// files listed above (and tokenizer_corpus.txt and *.tmp files, which earlier versions and
// interrupted atomic writes leave). Anything else (a file, a folder with other files or subfolders)
// is refused with an error: prepare never deletes what it did not write. A symbolic link OUT is
// followed, and the folder it points to is replaced.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "s3r/data/text_input.hpp"  // read_documents (for callers of this header)

namespace s3r::data {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;               // receives tokenizer.model, train.bin, val.bin, info.json
  std::string tokenizer_model;       // existing model to use; empty: train one
  int64_t vocab_size = 4096;         // of a trained tokenizer, in [kMinVocab, kMaxVocab]
  double val_fraction = 0.05;        // in (0, 1)
  int64_t max_training_sentences = 2000000;  // SentencePiece's input_sentence_size (> 100)
  // For tests only: called with the temporary folder once everything in it is written and
  // verified, just before it is swapped in; a throw from it aborts the prepare (the temporary
  // folder is removed and OUT stays as it was).
  std::function<void(const std::string& temp_dir)> before_swap;
};

inline constexpr int64_t kMinVocab = 260;
inline constexpr int64_t kMaxVocab = int64_t{1} << 20;

struct PrepareResult {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0;
  uint32_t vocab = 0;
  std::vector<std::string> warnings;  // skipped files, also sent to `progress` as "warning: ..."
};

// `progress` receives status lines, and each warning prefixed with "warning: "; it may be empty.
PrepareResult prepare(const PrepareOptions& options,
                      const std::function<void(const std::string&)>& progress);

}  // namespace s3r::data
