#include "io/trace.h"

#include <H5Cpp.h>
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/errors.h"
#include "common/fault.h"
#include "common/files.h"
#include "common/lock.h"
#include "common/utf8.h"

namespace divlab {

namespace {
constexpr hsize_t kChunk = 256;  // steps per chunk of a series
constexpr hsize_t kPage = 4096;  // the smallest page a kernel writes in one piece

// Variable-length UTF-8: h5py returns str, pandas-friendly.
H5::StrType utf8_string() {
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  return t;
}

H5::PredType h5_type(TraceWriter::Kind k) {
  return k == TraceWriter::Kind::Int64 ? H5::PredType::NATIVE_INT64 : H5::PredType::NATIVE_DOUBLE;
}

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}
std::string leaf_of(const std::string& path) {
  return path.substr(path.find_last_of('/') + 1);
}
}  // namespace

struct TraceWriter::Impl {
  H5::H5File file;
  struct Series {
    H5::DataSet ds;
    Kind kind;
    std::vector<double> f;
    std::vector<int64_t> i;
    hsize_t written = 0;
  };
  std::map<std::string, Series> series;
  bool started = false, finished = false;

  // Writes one series' buffered appends; false if it had none.
  static bool append_pending(Series& s) {
    const hsize_t n = s.kind == Kind::Int64 ? s.i.size() : s.f.size();
    if (n == 0) return false;
    const hsize_t total = s.written + n;
    s.ds.extend(&total);
    H5::DataSpace file_space = s.ds.getSpace();
    file_space.selectHyperslab(H5S_SELECT_SET, &n, &s.written);
    H5::DataSpace mem_space(1, &n);
    if (s.kind == Kind::Int64)
      s.ds.write(s.i.data(), H5::PredType::NATIVE_INT64, mem_space, file_space);
    else
      s.ds.write(s.f.data(), H5::PredType::NATIVE_DOUBLE, mem_space, file_space);
    s.written = total;
    s.f.clear(), s.i.clear();
    return true;
  }

  H5::Group group(const std::string& path) {  // opens or creates, with parents
    if (path == "/") return file.openGroup("/");
    H5::Group parent = group(parent_of(path));
    if (H5Lexists(parent.getId(), leaf_of(path).c_str(), H5P_DEFAULT) > 0)
      return parent.openGroup(leaf_of(path));
    return parent.createGroup(leaf_of(path));
  }
  H5::H5Object* object(const std::string& path, H5::Group& g, H5::DataSet& d) {
    const bool exists = path == "/" || H5Lexists(file.getId(), path.c_str(), H5P_DEFAULT) > 0;
    if (!exists || file.childObjType(path) == H5O_TYPE_GROUP) {
      g = group(path);
      return &g;
    }
    d = file.openDataSet(path);
    return &d;
  }
};

TraceWriter::TraceWriter(const std::string& path, bool overwrite)
    : impl_(std::make_unique<Impl>()), path_(path), partial_path_(path + ".partial") {
  H5::Exception::dontPrint();
  if (!overwrite && access(path.c_str(), F_OK) == 0)
    throw InputError("trace '" + path + "': already exists");
  try {
    H5::FileAccPropList fapl;
    fapl.setLibverBounds(H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);  // required by SWMR
    // A write killed by a signal stops at a page boundary (the kernel checks for a fatal signal
    // between pages), so a metadata block that spans two pages can be left half old, half new,
    // and its checksum then fails for good. Paged allocation keeps every block smaller than a
    // page inside one page; SWMR's write order (children before parents) does the rest.
    H5::FileCreatPropList fcpl;
    H5Pset_file_space_strategy(fcpl.getId(), H5F_FSPACE_STRATEGY_PAGE, false, 1);
    H5Pset_file_space_page_size(fcpl.getId(), kPage);
    impl_->file = H5::H5File(partial_path_, H5F_ACC_TRUNC, fcpl, fapl);
  } catch (const H5::Exception&) {
    throw InputError("trace '" + path + "': cannot create '" + partial_path_ + "'");
  }
  last_flush_ = std::chrono::steady_clock::now();
}

TraceWriter::TraceWriter() = default;

TraceWriter::~TraceWriter() {
  if (!impl_ || impl_->finished) return;
  if (!published_) {  // an error before the trace was readable: leave nothing behind
    try {
      impl_->series.clear();
      // After a failed write (space the file-size limit or a full disk would not give), HDF5
      // 1.10 crashed closing the file (SIGSEGV in H5F__close; a summary.h5 under a full disk),
      // with its descriptor pointed at /dev/null too. The file is discarded anyway: its handle
      // is left open, for the error to end the command with its one line.
      if (write_failed_) {
        static_cast<void>(impl_.release());  // NOLINT(bugprone-unused-return-value)
        unlink(partial_path_.c_str());
        return;
      }
      impl_->file.close();
    } catch (...) {
    }
    unlink(partial_path_.c_str());
    return;
  }
  // A writer destroyed without finish() (an exception unwinding) still flushes what it has;
  // the status stays "running", which readers treat as not completed.
  try {
    flush();
  } catch (...) {
  }
}

void TraceWriter::attr(const std::string& object, const std::string& name,
                       const std::string& value) {
  if (!impl_) return;  // a writer that keeps nothing
  H5::Group g;
  H5::DataSet d;
  H5::H5Object* o = impl_->object(object, g, d);
  const H5::StrType type = utf8_string();
  o->createAttribute(name, type, H5::DataSpace(H5S_SCALAR)).write(type, value);
}

void TraceWriter::attr(const std::string& object, const std::string& name, double value) {
  if (!impl_) return;  // a writer that keeps nothing
  H5::Group g;
  H5::DataSet d;
  impl_->object(object, g, d)
      ->createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR))
      .write(H5::PredType::NATIVE_DOUBLE, &value);
}

void TraceWriter::attr(const std::string& object, const std::string& name, int64_t value) {
  if (!impl_) return;  // a writer that keeps nothing
  H5::Group g;
  H5::DataSet d;
  impl_->object(object, g, d)
      ->createAttribute(name, H5::PredType::NATIVE_INT64, H5::DataSpace(H5S_SCALAR))
      .write(H5::PredType::NATIVE_INT64, &value);
}

void TraceWriter::status_attr(RunStatus status) {
  if (!impl_) return;  // a writer that keeps nothing
  attr("/", "status", std::string(name_of(status)));
}

void TraceWriter::series(const std::string& path, Kind kind) {
  if (!impl_) return;  // a writer that keeps nothing
  H5::Group parent = impl_->group(parent_of(path));
  const hsize_t zero = 0, unlimited = H5S_UNLIMITED;
  H5::DSetCreatPropList dcpl;
  dcpl.setChunk(1, &kChunk);
  H5::DataSet ds =
      parent.createDataSet(leaf_of(path), h5_type(kind), H5::DataSpace(1, &zero, &unlimited), dcpl);
  impl_->series[path] = {ds, kind, {}, {}, 0};
}

void TraceWriter::array(const std::string& path, Kind kind, int64_t size) {
  if (!impl_) return;  // a writer that keeps nothing
  array(path, kind, std::vector<int64_t>{size});
}

void TraceWriter::array(const std::string& path, Kind kind, const std::vector<int64_t>& shape) {
  if (!impl_) return;  // a writer that keeps nothing
  H5::Group parent = impl_->group(parent_of(path));
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5::DSetCreatPropList dcpl;
  const int64_t zero = 0;
  dcpl.setFillValue(h5_type(kind), &zero);
  parent.createDataSet(leaf_of(path), h5_type(kind), H5::DataSpace(int(dims.size()), dims.data()),
                       dcpl);
}

void TraceWriter::bytes(const std::string& path, const std::string& data) {
  if (!impl_) return;  // a writer that keeps nothing
  H5::Group parent = impl_->group(parent_of(path));
  const hsize_t n = data.size();
  H5::DataSet ds =
      parent.createDataSet(leaf_of(path), H5::PredType::NATIVE_UINT8, H5::DataSpace(1, &n));
  if (n) ds.write(data.data(), H5::PredType::NATIVE_UINT8);
}

void TraceWriter::start() {
  if (!impl_) return;  // a writer that keeps nothing
  reserve(0);
  impl_->file.flush(H5F_SCOPE_GLOBAL);
  if (H5Fstart_swmr_write(impl_->file.getId()) < 0)
    throw std::runtime_error("trace '" + path_ + "': cannot start SWMR writing");
  impl_->started = true;
}

void TraceWriter::append(const std::string& name, double value) {
  if (!impl_) return;  // a writer that keeps nothing
  auto& s = impl_->series.at(name);
  if (s.kind == Kind::Int64)
    s.i.push_back(int64_t(value));
  else
    s.f.push_back(value);
}

void TraceWriter::append(const std::string& name, int64_t value) {
  if (!impl_) return;  // a writer that keeps nothing
  auto& s = impl_->series.at(name);
  if (s.kind == Kind::Int64)
    s.i.push_back(value);
  else
    s.f.push_back(double(value));
}

void TraceWriter::write_array(const std::string& path, const void* values, int64_t count,
                              const H5::PredType& type) {
  if (!impl_) return;  // a writer that keeps nothing
  if (write_failed_) return;
  reserve(count * 8);
  try {
    H5::DataSet ds = impl_->file.openDataSet(path);
    if (ds.getSpace().getSimpleExtentNpoints() != count)
      throw std::logic_error("trace: " + std::to_string(count) + " values for '" + path +
                             "', which holds " +
                             std::to_string(ds.getSpace().getSimpleExtentNpoints()));
    ds.write(values, type);
  } catch (const H5::Exception&) {
    write_failed("writing");
  }
}
void TraceWriter::write_array(const std::string& path, const std::vector<double>& values) {
  if (!impl_) return;  // a writer that keeps nothing
  write_array(path, values.data(), int64_t(values.size()), H5::PredType::NATIVE_DOUBLE);
}
void TraceWriter::write_array(const std::string& path, const std::vector<int64_t>& values) {
  if (!impl_) return;  // a writer that keeps nothing
  write_array(path, values.data(), int64_t(values.size()), H5::PredType::NATIVE_INT64);
}

void TraceWriter::maybe_flush(int64_t flush_steps, double flush_seconds) {
  if (!impl_) return;  // a writer that keeps nothing
  const double since =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush_).count();
  // Each step appends to every series; count steps by the loss series' pending length.
  size_t pending = 0;
  for (const auto& [name, s] : impl_->series) pending = std::max(pending, s.f.size() + s.i.size());
  if (int64_t(pending) >= flush_steps || since >= flush_seconds) flush();
}

void TraceWriter::write_failed(const char* what) {
  write_failed_ = true;
  const int err = errno;
  throw TraceWriteError("trace '" + path_ + "': " + what + " failed" +
                        (err ? std::string(" (") + std::strerror(err) + ")" : std::string()) +
                        ": disk full, or the file or its folder became unwritable; the trace "
                        "keeps every step flushed before");
}

void TraceWriter::reserve(int64_t bytes) {
  // Beyond one round of new chunks for every series and HDF5 metadata; large writes (checkpoint
  // arrays) reserve their own size on top.
  constexpr int64_t kHeadroom = 256 << 10;
  hsize_t eof = 0;
  H5Fget_filesize(impl_->file.getId(), &eof);
  const int64_t need = int64_t(eof) + bytes + kHeadroom / 2;
  if (need <= reserved_) return;
  // HDF5's own descriptor: the file may have been renamed since it was opened.
  int* fd = nullptr;
  const int rc =
      H5Fget_vfd_handle(impl_->file.getId(), H5P_DEFAULT, reinterpret_cast<void**>(&fd)) < 0
          ? EBADF
          : posix_fallocate(*fd, 0, need + kHeadroom);
  if (rc != 0) {
    errno = rc;
    write_failed("reserving space for the next write");
  }
  reserved_ = need + kHeadroom;
}

void TraceWriter::flush() {
  if (!impl_) return;         // a writer that keeps nothing
  if (write_failed_) return;  // nothing more will reach the file
  int64_t pending = 0;
  for (const auto& [name, s] : impl_->series)
    pending += int64_t(s.f.size() + s.i.size()) * 8 + int64_t(kChunk) * 8;  // + a new chunk
  reserve(pending);
  errno = 0;
  try {
    flush_series();
    impl_->file.flush(H5F_SCOPE_GLOBAL);
  } catch (const H5::Exception&) {
    write_failed("writing");
  }
  last_flush_ = std::chrono::steady_clock::now();
}

void TraceWriter::commit_series(const std::string& series) {
  if (!impl_) return;  // a writer that keeps nothing
  commit_series_ = series;
}

void TraceWriter::flush_series() {
  // HDF5 writes dirty metadata in its own order, not the order of the calls: the commit series
  // is extended only after the file holds every other series' new length.
  auto commit = impl_->series.find(commit_series_);
  bool others_grew = false;
  for (auto it = impl_->series.begin(); it != impl_->series.end(); ++it)
    if (it != commit) others_grew |= Impl::append_pending(it->second);
  if (commit == impl_->series.end()) return;
  if (others_grew) {
    impl_->file.flush(H5F_SCOPE_GLOBAL);
    fault_point("trace.between_flushes");
  }
  Impl::append_pending(commit->second);
}

void TraceWriter::publish() {
  if (!impl_) return;  // a writer that keeps nothing
  if (published_) return;
  flush();
  fault_point("trace.before_publish");
  if (std::rename(partial_path_.c_str(), path_.c_str()) != 0)
    throw std::runtime_error("trace: cannot rename '" + partial_path_ + "' to '" + path_ +
                             "': " + std::strerror(errno));
  published_ = true;
}

namespace {
// Root attributes (string values), replacing any of the same name; finish() and record_crash()
// write a run's outcome with them, the "status" they then write in place last.
void set_root_strings(H5::Group& root,
                      const std::vector<std::pair<std::string, std::string>>& attrs) {
  const H5::StrType type = utf8_string();
  for (const auto& [name, value] : attrs) {
    if (root.attrExists(name)) root.removeAttr(name);
    root.createAttribute(name, type, H5::DataSpace(H5S_SCALAR)).write(type, value);
  }
}
}  // namespace

void TraceWriter::finish(RunStatus status,
                         const std::vector<std::pair<std::string, std::string>>& attrs) {
  if (!impl_) return;  // a writer that keeps nothing
  publish();
  flush();
  impl_->series.clear();
  // Still in SWMR writing: a kill from here on leaves a trace flagged as SWMR-written, which
  // reads like any killed run's. Reopened for ordinary writing it would be unreadable until
  // h5clear. The status is written last, in place, so "completed" implies every other attribute.
  try {
    H5::Group root = impl_->file.openGroup("/");
    set_root_strings(root, attrs);
    fault_point("trace.finishing");
    root.openAttribute("status").write(utf8_string(), std::string(name_of(status)));
    impl_->file.close();
  } catch (const H5::Exception&) {
    write_failed("recording the outcome");
  }
  impl_->finished = true;
}

bool record_crash(const std::string& path, const std::string& failure) {
  if (access(path.c_str(), W_OK) != 0 || access((path + ".partial").c_str(), F_OK) == 0)
    return false;
  H5::Exception::dontPrint();
  try {
    H5::FileAccPropList fapl;
    fapl.setLibverBounds(H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    // HDF5's own name for what h5clear does: open a file whose writer died before closing it.
    hbool_t clear = true;
    if (H5Pset(fapl.getId(), "clear_status_flags", &clear) < 0) return false;
    H5::H5File file(path, H5F_ACC_RDWR, H5::FileCreatPropList::DEFAULT, fapl);
    H5::Group root = file.openGroup("/");
    if (!root.attrExists("status")) return false;
    std::string now;
    {
      H5::Attribute status = root.openAttribute("status");
      if (status.getTypeClass() != H5T_STRING) return false;
      status.read(status.getStrType(), now);
    }
    if (now != name_of(RunStatus::Running)) return false;
    set_root_strings(root, {{"failure", failure}});
    root.openAttribute("status").write(utf8_string(),
                                       std::string(name_of(RunStatus::Failed)));  // last
    root.close();
    file.close();
    return true;
  } catch (const H5::Exception&) {
    return false;
  }
}

bool record_crash_after_writer(const std::string& path, const std::string& failure,
                               double wait_seconds) {
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds);
  while (true) {
    try {
      WriterLock lock(path + ".lock", "--out '" + path + "'");
      const bool recorded = record_crash(path, failure);
      if (recorded) lock.done();  // the trace's last word: its dead writer's lock file goes too
      return recorded;
    } catch (const InputError&) {
      if (std::chrono::steady_clock::now() >= give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

// ------------------------------------------------------------------------------------------
struct TraceReader::Impl {
  H5::H5File file;
};

TraceReader::TraceReader(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  H5::Exception::dontPrint();
  require_input_file(path, "trace", ", not a trace (a run's --out file)");
  if (access(path.c_str(), R_OK) != 0) throw InputError("trace '" + path + "': cannot be read");
  // A SWMR reader retries a metadata read whose checksum fails (the writer may be mid-flush),
  // 100 times with growing sleeps by default: a corrupt file then takes minutes to refuse (found
  // by fuzz/fuzz_trace.cpp). A few attempts cover a concurrent flush.
  H5::FileAccPropList access_props;
  H5Pset_metadata_read_attempts(access_props.getId(), 4);
  try {
    impl_->file = H5::H5File(path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ,
                             H5::FileCreatPropList::DEFAULT, access_props);
  } catch (const H5::Exception&) {
    try {  // a file written without SWMR (e.g. by h5py) opens the ordinary way
      impl_->file = H5::H5File(path, H5F_ACC_RDONLY);
    } catch (const H5::Exception&) {
      throw InputError("trace '" + path + "': not a readable HDF5 file (truncated or corrupt?)");
    }
  }
}
TraceReader::~TraceReader() = default;

bool TraceReader::exists(const std::string& path) const {
  // Walk the path one link at a time: H5Lexists needs every parent to exist.
  std::string sofar;
  size_t pos = 1;
  while (pos <= path.size()) {
    const size_t next = std::min(path.find('/', pos), path.size());
    sofar = path.substr(0, next);
    if (H5Lexists(impl_->file.getId(), sofar.c_str(), H5P_DEFAULT) <= 0) return false;
    pos = next + 1;
  }
  return true;
}

namespace {
H5::Attribute open_attr(H5::H5File& f, const std::string& object, const std::string& name) {
  if (object == "/" || f.childObjType(object) == H5O_TYPE_GROUP)
    return f.openGroup(object).openAttribute(name);
  return f.openDataSet(object).openAttribute(name);
}
}  // namespace

bool TraceReader::has_attr(const std::string& object, const std::string& name) const {
  return H5Aexists_by_name(impl_->file.getId(), object.c_str(), name.c_str(), H5P_DEFAULT) > 0;
}

// Attributes another tool rewrote (h5py writes whatever type it is handed) are read by their
// type class: a number read as text gave its raw bytes (a status of -7 printed as 8 bytes of
// invalid UTF-8), text read as a number failed as "missing".
std::string TraceReader::string_attr(const std::string& object, const std::string& name) const {
  std::string value;
  try {
    H5::Attribute a = open_attr(impl_->file, object, name);
    if (a.getTypeClass() != H5T_STRING)
      throw InputError("trace '" + path_ + "': attribute " + object + "@" + name +
                       " is not text (rewritten by another tool, or corrupt?)");
    a.read(a.getStrType(), value);
  } catch (const H5::Exception&) {
    throw InputError("trace '" + path_ + "': missing attribute " + object + "@" + name);
  }
  if (first_invalid_utf8(value) != std::string::npos)
    throw InputError("trace '" + path_ + "': attribute " + object + "@" + name +
                     " is not UTF-8 text (corrupt?)");
  return value;
}

RunStatus TraceReader::status() const {
  const std::string text = string_attr("/", "status");
  RunStatus s{};
  if (!parse_name(text, &s))
    throw InputError("trace '" + path_ + "': status '" + one_line(text) +
                     "' is none divlab writes (" + names_text<RunStatus>() + ")");
  return s;
}

double TraceReader::number_attr(const std::string& object, const std::string& name) const {
  try {
    H5::Attribute a = open_attr(impl_->file, object, name);
    const H5T_class_t type = a.getTypeClass();
    if (type != H5T_INTEGER && type != H5T_FLOAT)
      throw InputError("trace '" + path_ + "': attribute " + object + "@" + name +
                       " is not a number (rewritten by another tool, or corrupt?)");
    double v = 0;
    a.read(H5::PredType::NATIVE_DOUBLE, &v);
    return v;
  } catch (const H5::Exception&) {
    throw InputError("trace '" + path_ + "': missing attribute " + object + "@" + name);
  }
}

namespace {
template <class V>
std::vector<V> read_1d(H5::H5File& f, const std::string& path, const std::string& file,
                       const H5::PredType& type, bool any_rank = false) {
  try {
    H5::DataSet ds = f.openDataSet(path);
    const H5::DataSpace space = ds.getSpace();
    const int rank = space.getSimpleExtentNdims();
    if (any_rank ? (rank < 1 || rank > 8) : rank != 1)
      throw InputError("trace '" + file + "': dataset " + path + " is not " +
                       (any_rank ? "a tensor" : "one-dimensional"));
    const hsize_t n = hsize_t(space.getSimpleExtentNpoints());
    // A damaged header can claim any length: refuse more than the file could hold.
    if (n > (hsize_t(1) << 34) / sizeof(V))
      throw InputError("trace '" + file + "': dataset " + path + " claims " + std::to_string(n) +
                       " values (corrupt?)");
    std::vector<V> out(n);
    if (n) ds.read(out.data(), type);
    return out;
  } catch (const H5::Exception&) {
    throw InputError("trace '" + file + "': cannot read dataset " + path);
  }
}
}  // namespace

std::vector<double> TraceReader::floats(const std::string& path) const {
  return read_1d<double>(impl_->file, path, path_, H5::PredType::NATIVE_DOUBLE);
}
std::vector<double> TraceReader::tensor(const std::string& path) const {
  return read_1d<double>(impl_->file, path, path_, H5::PredType::NATIVE_DOUBLE, true);
}
std::vector<int64_t> TraceReader::ints(const std::string& path) const {
  return read_1d<int64_t>(impl_->file, path, path_, H5::PredType::NATIVE_INT64);
}
std::string TraceReader::blob(const std::string& path) const {
  const auto v = read_1d<uint8_t>(impl_->file, path, path_, H5::PredType::NATIVE_UINT8);
  return std::string(v.begin(), v.end());
}

bool TraceReader::is_group(const std::string& path) const {
  try {
    return exists(path) && impl_->file.childObjType(path) == H5O_TYPE_GROUP;
  } catch (const H5::Exception&) {  // a link to a damaged object header (found by fuzzing)
    throw InputError("trace '" + path_ + "': unreadable object " + path + " (corrupt?)");
  }
}

std::vector<std::string> TraceReader::children(const std::string& group) const {
  std::vector<std::string> out;
  try {
    H5::Group g = impl_->file.openGroup(group);
    for (hsize_t i = 0; i < g.getNumObjs(); ++i) out.push_back(g.getObjnameByIdx(i));
  } catch (const H5::Exception&) {
    throw InputError("trace '" + path_ + "': no group " + group);
  }
  return out;
}

}  // namespace divlab
