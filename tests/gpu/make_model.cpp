// Writes a safetensors file of pseudo-random F16 weights for the GPU run:
//
//   devalloc_make_model OUT.safetensors GIB
//   devalloc_make_model OUT.safetensors MIBM     (e.g. 64M, for smoke runs)
//
// GIB GiB in tensors of 128 MiB ("layers.N.weight", shape [8192, 8192]), or
// MIB MiB in tensors of 2 MiB (shape [1024, 1024]).
// Streamed in pieces, so that a model of many GiB needs no memory of that
// size (the core's write_safetensors takes every tensor's bytes at once), and
// free of the core's dependencies, so that it builds wherever g++ does.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr uint64_t kPiece = uint64_t{8} << 20;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "devalloc_make_model: %s\n", message.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: devalloc_make_model OUT.safetensors GIB|MIBM\n");
    return 2;
  }
  const std::string size = argv[2];
  const bool in_mib = !size.empty() && size.back() == 'M';
  const uint64_t count = std::strtoull(size.c_str(), nullptr, 10);
  if (count == 0 || count > 1024) die("the size must be between 1 and 1024 (GiB, or MiB with M)");
  const uint64_t kRows = in_mib ? 1024 : 8192;
  const uint64_t kColumns = kRows;
  const uint64_t kTensorBytes = kRows * kColumns * 2;  // F16
  const uint64_t tensors = (count << (in_mib ? 20 : 30)) / kTensorBytes;
  if (tensors == 0) die("the size holds no tensor of " + std::to_string(kTensorBytes) + " bytes");

  std::string header =
      "{\"__metadata__\":{\"generator\":\"devalloc_make_model\"}";
  for (uint64_t t = 0; t < tensors; ++t) {
    header += ",\"layers." + std::to_string(t) +
              ".weight\":{\"dtype\":\"F16\",\"shape\":[" +
              std::to_string(kRows) + "," + std::to_string(kColumns) +
              "],\"data_offsets\":[" + std::to_string(t * kTensorBytes) + "," +
              std::to_string((t + 1) * kTensorBytes) + "]}";
  }
  header += "}";
  // The data starts at a multiple of 8, as the format recommends.
  header.append((8 - header.size() % 8) % 8, ' ');

  std::FILE* out = std::fopen(argv[1], "wb");
  if (out == nullptr) die(std::string("cannot create ") + argv[1]);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  bool ok = std::fwrite(length, 1, 8, out) == 8 &&
            std::fwrite(header.data(), 1, header.size(), out) == header.size();

  std::vector<uint64_t> piece(kPiece / 8);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (uint64_t written = 0; ok && written < tensors * kTensorBytes;) {
    const uint64_t n = std::min(kPiece, tensors * kTensorBytes - written);
    for (auto& word : piece) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      word = state;
    }
    ok = std::fwrite(piece.data(), 1, n, out) == n;
    written += n;
  }
  if (std::fclose(out) != 0 || !ok) die(std::string("cannot write ") + argv[1]);
  std::printf("%s: %llu tensors, %llu bytes of data\n", argv[1],
              static_cast<unsigned long long>(tensors),
              static_cast<unsigned long long>(tensors * kTensorBytes));
  return 0;
}
