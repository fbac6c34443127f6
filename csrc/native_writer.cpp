// ckpt._native_writer: write one checkpoint file from (offset, buffer) segments with
// several threads, hashing each content-hash chunk while it is written, without the GIL.
//
// Why pybind11 (and not a torch extension or nanobind): the writer needs only raw byte
// buffers (the Python side turns tensors into buffers), no ATen. A torch C++ extension
// compiles against torch's headers (minutes on 2 cores) and ties the .so to one torch
// build; nanobind wants CMake / scikit-build; pybind11 is header-only and builds with the
// plain setuptools Extension in setup.py. See docs/native_writer.md.
//
// The pure-Python twin is ckpt/writers/python_writer.py; both must give the same bytes
// and the same digests (tests/unit/test_writers.py). Rules shared with the twin:
//  - segments are sorted and contiguous, covering [0, size) exactly (else ValueError);
//  - chunk i is [i*C, min((i+1)*C, size)); an empty file has one empty chunk;
//  - a worker takes whole chunks; inside a chunk it walks the segments in order and
//    handles them in pieces of kPieceBytes: pwrite the piece, then hash it while it is
//    still in cache;
//  - a piece goes through the O_DIRECT descriptor when its file offset, address and
//    length are all kAlign-aligned, else through the buffered one;
//  - after a chunk, sync_file_range(SYNC_FILE_RANGE_WRITE) starts its writeback early;
//  - with a gate (ckpt/writers/gate.py), a piece of segment i is written only once
//    landed[sources[i]] >= the piece's end within the segment: the staging copy filling
//    that buffer has passed it. landed's last cell set means the copy failed: ECANCELED.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <openssl/evp.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace py = pybind11;

namespace {

constexpr uint64_t kAlign = 4096;            // O_DIRECT alignment (offset, address, length)
constexpr uint64_t kPieceBytes = 1u << 20;   // write+hash step: stays in L2/L3 between the two

struct Segment {
    uint64_t offset;
    const unsigned char* data;
    uint64_t length;
};

// Per-buffer copy progress a writer waits on (see the header); empty: nothing to wait for.
struct Gate {
    const int64_t* landed = nullptr;   // bytes landed per buffer; the last cell: copy failed
    uint64_t landed_count = 0;
    const int64_t* sources = nullptr;  // per segment: index into landed, or -1

    // Waits until segment `segment` holds `upto` bytes; false when the copy failed.
    bool wait(size_t segment, uint64_t upto) const {
        if (sources == nullptr || sources[segment] < 0) return true;
        const int64_t* cell = landed + sources[segment];
        const int64_t* failed = landed + landed_count - 1;
        // The copier stores each cell after the bytes it counts (Python, no fence of its
        // own): an acquire load here orders our reads of those bytes after it.
        for (unsigned polls = 0;
             __atomic_load_n(cell, __ATOMIC_ACQUIRE) < static_cast<int64_t>(upto); ++polls) {
            if (__atomic_load_n(failed, __ATOMIC_ACQUIRE) != 0) return false;
            // A copy moves gigabytes per second: short naps first, then longer ones.
            std::this_thread::sleep_for(std::chrono::microseconds(polls < 200 ? 20 : 500));
        }
        return true;
    }
};

// Python buffers held for the duration of one call (released with the GIL held).
class HeldBuffers {
public:
    ~HeldBuffers() {
        for (auto& view : views_) PyBuffer_Release(&view);
    }
    const Py_buffer& hold(PyObject* obj) {
        views_.emplace_back();
        if (PyObject_GetBuffer(obj, &views_.back(), PyBUF_SIMPLE) != 0) {
            views_.pop_back();
            throw py::error_already_set();
        }
        return views_.back();
    }
private:
    std::deque<Py_buffer> views_;  // a deque: a held Py_buffer never moves
};

// The first error any thread met; the others stop taking chunks once it is set.
class FirstError {
public:
    void set(int err) {
        int expected = 0;
        errno_.compare_exchange_strong(expected, err);
    }
    int get() const { return errno_.load(); }
private:
    std::atomic<int> errno_{0};
};

bool aligned(uint64_t offset, const void* addr, uint64_t length) {
    return offset % kAlign == 0 && reinterpret_cast<uintptr_t>(addr) % kAlign == 0 &&
           length % kAlign == 0;
}

// pwrite all of [data, data+length) at offset; returns 0 or an errno.
int pwrite_all(int fd, const unsigned char* data, uint64_t length, uint64_t offset) {
    while (length > 0) {
        ssize_t n = ::pwrite(fd, data, length, static_cast<off_t>(offset));
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return EIO;
        data += n;
        length -= static_cast<uint64_t>(n);
        offset += static_cast<uint64_t>(n);
    }
    return 0;
}

std::string hex(const unsigned char* md, unsigned int len) {
    static const char digits[] = "0123456789abcdef";
    std::string out(len * 2, '0');
    for (unsigned int i = 0; i < len; ++i) {
        out[2 * i] = digits[md[i] >> 4];
        out[2 * i + 1] = digits[md[i] & 0xf];
    }
    return out;
}

enum class Alg { kSha256, kXxh3_128 };

// One chunk's content hash, named as ckpt/content_hash.py names it ("sha256": OpenSSL,
// SHA-NI where the CPU has it; "xxh3-128": libxxhash, canonical big-endian hex).
class ChunkHasher {
public:
    explicit ChunkHasher(Alg alg) : alg_(alg) {}
    ~ChunkHasher() {
        if (sha_) EVP_MD_CTX_free(sha_);
        if (xxh_) XXH3_freeState(xxh_);
    }
    bool ok() {
        if (alg_ == Alg::kSha256) return (sha_ = EVP_MD_CTX_new()) != nullptr;
        return (xxh_ = XXH3_createState()) != nullptr;
    }
    bool reset() {
        if (alg_ == Alg::kSha256) return EVP_DigestInit_ex(sha_, EVP_sha256(), nullptr) == 1;
        return XXH3_128bits_reset(xxh_) == XXH_OK;
    }
    bool update(const unsigned char* data, uint64_t len) {
        if (alg_ == Alg::kSha256) return EVP_DigestUpdate(sha_, data, len) == 1;
        return XXH3_128bits_update(xxh_, data, len) == XXH_OK;
    }
    bool hex_digest(std::string* out) {
        if (alg_ == Alg::kSha256) {
            unsigned char md[EVP_MAX_MD_SIZE];
            unsigned int md_len = 0;
            if (EVP_DigestFinal_ex(sha_, md, &md_len) != 1) return false;
            *out = hex(md, md_len);
            return true;
        }
        XXH128_canonical_t canonical;
        XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(xxh_));
        *out = hex(canonical.digest, sizeof(canonical.digest));
        return true;
    }

private:
    Alg alg_;
    EVP_MD_CTX* sha_ = nullptr;
    XXH3_state_t* xxh_ = nullptr;
};

class FileWriter {
public:
    FileWriter(int fd, int direct_fd, uint64_t size, uint64_t chunk_bytes,
               std::vector<Segment> segments, Alg alg, Gate gate)
        : alg_(alg), gate_(gate), fd_(fd), direct_fd_(direct_fd), size_(size), chunk_bytes_(chunk_bytes),
          segments_(std::move(segments)),
          chunk_count_(size == 0 ? 1 : (size + chunk_bytes - 1) / chunk_bytes),
          digests_(chunk_count_) {}

    // Runs `threads` workers over all chunks; returns 0 or the first errno met.
    int run(unsigned threads) {
        unsigned n = static_cast<unsigned>(
            std::max<uint64_t>(1, std::min<uint64_t>(threads, chunk_count_)));
        std::vector<std::thread> pool;
        for (unsigned i = 1; i < n; ++i) {
            try {
                pool.emplace_back([this] { work(); });
            } catch (const std::system_error&) {
                break;  // no more threads to be had: the ones running take every chunk
            }
        }
        work();  // the calling thread is one of the workers
        for (auto& t : pool) t.join();
        return error_.get();
    }

    const std::vector<std::string>& digests() const { return digests_; }

private:
    void work() {
        ChunkHasher hasher(alg_);
        if (!hasher.ok()) return error_.set(ENOMEM);
        while (error_.get() == 0) {
            uint64_t chunk = next_chunk_.fetch_add(1);
            if (chunk >= chunk_count_) return;
            int err = write_chunk(chunk, &hasher);
            if (err != 0) return error_.set(err);
        }
    }

    int write_chunk(uint64_t chunk, ChunkHasher* hasher) {
        uint64_t start = chunk * chunk_bytes_;
        uint64_t end = std::min(start + chunk_bytes_, size_);
        if (!hasher->reset()) return EIO;
        for (size_t i = first_segment_at(start); i < segments_.size(); ++i) {
            const Segment& seg = segments_[i];
            if (seg.offset >= end) break;
            uint64_t from = std::max(seg.offset, start);
            uint64_t to = std::min(seg.offset + seg.length, end);
            for (uint64_t pos = from; pos < to; pos += kPieceBytes) {
                uint64_t len = std::min(kPieceBytes, to - pos);
                const unsigned char* data = seg.data + (pos - seg.offset);
                if (!gate_.wait(i, pos - seg.offset + len)) return ECANCELED;
                int err = write_piece(data, len, pos);
                if (err != 0) return err;
                if (!hasher->update(data, len)) return EIO;
            }
        }
        if (!hasher->hex_digest(&digests_[chunk])) return EIO;
        // A hint only: a failure here would show again at fsync, which reports it.
        if (end > start) ::sync_file_range(fd_, start, end - start, SYNC_FILE_RANGE_WRITE);
        return 0;
    }

    int write_piece(const unsigned char* data, uint64_t len, uint64_t pos) {
        int fd = direct_fd_.load();
        if (fd >= 0 && aligned(pos, data, len)) {
            int err = pwrite_all(fd, data, len, pos);
            if (err != EINVAL) return err;
            // The filesystem refused O_DIRECT after all: buffered from now on.
            direct_fd_.store(-1);
        }
        return pwrite_all(fd_, data, len, pos);
    }

    // Index of the segment holding byte `offset` (segments are contiguous and sorted).
    size_t first_segment_at(uint64_t offset) const {
        auto it = std::upper_bound(
            segments_.begin(), segments_.end(), offset,
            [](uint64_t off, const Segment& seg) { return off < seg.offset; });
        return it == segments_.begin() ? 0 : static_cast<size_t>(it - segments_.begin() - 1);
    }

    const Alg alg_;
    const Gate gate_;
    const int fd_;
    std::atomic<int> direct_fd_;
    const uint64_t size_, chunk_bytes_;
    const std::vector<Segment> segments_;
    const uint64_t chunk_count_;
    std::vector<std::string> digests_;
    std::atomic<uint64_t> next_chunk_{0};
    FirstError error_;
};

std::vector<Segment> checked_segments(uint64_t size, const py::sequence& segments,
                                      HeldBuffers& held) {
    std::vector<Segment> out;
    out.reserve(segments.size());
    uint64_t expected = 0;
    for (auto item : segments) {
        auto pair = item.cast<py::tuple>();
        if (pair.size() != 2) throw py::value_error("each segment must be (offset, buffer)");
        int64_t offset = pair[0].cast<int64_t>();
        const Py_buffer& view = held.hold(pair[1].ptr());
        if (offset < 0 || static_cast<uint64_t>(offset) != expected) {
            throw py::value_error("segments must be sorted and contiguous from 0: expected "
                                  "offset " + std::to_string(expected) + ", got " +
                                  std::to_string(offset));
        }
        uint64_t length = static_cast<uint64_t>(view.len);
        out.push_back({expected, static_cast<const unsigned char*>(view.buf), length});
        expected += length;
    }
    if (expected != size) {
        throw py::value_error("segments cover [0, " + std::to_string(expected) +
                              ") but the file size is " + std::to_string(size));
    }
    return out;
}

// The gate's two int64 arrays, checked (None and None: no gate).
Gate checked_gate(const py::object& landed, const py::object& sources, size_t segment_count,
                  HeldBuffers& held) {
    Gate gate;
    if (landed.is_none() && sources.is_none()) return gate;
    if (landed.is_none() || sources.is_none()) {
        throw py::value_error("a gate needs both landed and sources");
    }
    const Py_buffer& cells = held.hold(landed.ptr());
    const Py_buffer& from = held.hold(sources.ptr());
    if (cells.len < 8 || cells.len % 8 != 0 || from.len % 8 != 0 ||
        reinterpret_cast<uintptr_t>(cells.buf) % 8 != 0 ||
        reinterpret_cast<uintptr_t>(from.buf) % 8 != 0) {
        throw py::value_error("gate arrays must be aligned int64 arrays, landed non-empty");
    }
    gate.landed = static_cast<const int64_t*>(cells.buf);
    gate.landed_count = static_cast<uint64_t>(cells.len) / 8;
    gate.sources = static_cast<const int64_t*>(from.buf);
    if (static_cast<size_t>(from.len) / 8 != segment_count) {
        throw py::value_error("the gate names " + std::to_string(from.len / 8) +
                              " segments, the file has " + std::to_string(segment_count));
    }
    for (size_t i = 0; i < segment_count; ++i) {
        if (gate.sources[i] < -1 || gate.sources[i] >= static_cast<int64_t>(gate.landed_count - 1)) {
            throw py::value_error("gate source " + std::to_string(gate.sources[i]) +
                                  " of segment " + std::to_string(i) + " names no buffer");
        }
    }
    return gate;
}

// Opens the O_DIRECT descriptor, or returns -1 where the filesystem refuses it.
int open_direct(const std::string& path, int* err) {
    int fd = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0 && errno != EINVAL) *err = errno;
    return fd;
}

// Creates/truncates `path` and writes it; returns 0 or the first errno met.
int write_all(const std::string& path, uint64_t size, std::vector<Segment> segs,
              uint64_t chunk_bytes, unsigned threads, bool direct, bool fsync, Alg alg,
              Gate gate, std::vector<std::string>* digests) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    int err = 0;
    // Writing inside i_size lets parallel O_DIRECT writes share the inode lock. Only a
    // regular file has a size to set (a device such as /dev/full has none).
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        err = errno;
    } else if (S_ISREG(st.st_mode) && ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
        err = errno;
    }
    int direct_fd = (err == 0 && direct) ? open_direct(path, &err) : -1;
    if (err == 0) {
        FileWriter writer(fd, direct_fd, size, chunk_bytes, std::move(segs), alg, gate);
        err = writer.run(threads);
        if (err == 0) *digests = writer.digests();
    }
    if (err == 0 && fsync && ::fsync(fd) != 0) err = errno;
    if (direct_fd >= 0) ::close(direct_fd);
    if (::close(fd) != 0 && err == 0) err = errno;
    return err;
}

std::vector<std::string> write_file(const std::string& path, int64_t size,
                                    const py::sequence& segments, int64_t chunk_bytes,
                                    int threads, bool direct, bool fsync,
                                    const std::string& alg, const py::object& landed,
                                    const py::object& sources) {
    Alg chosen;
    if (alg == "sha256") {
        chosen = Alg::kSha256;
    } else if (alg == "xxh3-128") {
        chosen = Alg::kXxh3_128;
    } else {
        throw py::value_error("alg must be sha256 or xxh3-128, got " + alg);
    }
    if (size < 0) throw py::value_error("size must be >= 0, got " + std::to_string(size));
    if (chunk_bytes <= 0) {
        throw py::value_error("chunk_bytes must be > 0, got " + std::to_string(chunk_bytes));
    }
    if (threads < 1) throw py::value_error("threads must be >= 1, got " + std::to_string(threads));
    HeldBuffers held;  // requested with the GIL held; released after the work, with it
    std::vector<Segment> segs = checked_segments(static_cast<uint64_t>(size), segments, held);
    Gate gate = checked_gate(landed, sources, segs.size(), held);
    std::vector<std::string> digests;
    int err;
    {
        py::gil_scoped_release no_gil;
        err = write_all(path, static_cast<uint64_t>(size), std::move(segs),
                        static_cast<uint64_t>(chunk_bytes), static_cast<unsigned>(threads),
                        direct, fsync, chosen, gate, &digests);
    }
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
        throw py::error_already_set();
    }
    return digests;
}

}  // namespace

PYBIND11_MODULE(_native_writer, m) {
    m.doc() = "Multi-threaded pwrite + per-chunk content hash of one checkpoint file (GIL released).";
    m.def("write_file", &write_file, py::arg("path"), py::arg("size"), py::arg("segments"),
          py::arg("chunk_bytes"), py::arg("threads"), py::arg("direct"), py::arg("fsync"),
          py::arg("alg") = "sha256", py::arg("landed") = py::none(),
          py::arg("sources") = py::none(),
          "Write `segments` [(offset, buffer)] covering [0, size) to `path`; return the "
          "hex digest (sha256 or xxh3-128) of every chunk of chunk_bytes.");
}
