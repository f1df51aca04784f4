// The native KServe v2 front end: gRPC (grpc++) and request decoding outside Python's GIL.
//
// Why: a KServe unary call through grpc.aio costs the server about 300 us of Python per request
// (measured in docs/benchmarks.md), serial with the model's own Python on one GIL; that caps
// small requests under concurrency well below a compiled server. Here grpc++ receives the call
// on its own threads, parses the ModelInferRequest and, for the common request (raw contents of
// fixed-size datatypes, no tensor parameters), wraps each input as a numpy array over the request's
// own bytes. Python takes every call queued since it last looked in one go (an eventfd wakes its
// event loop), checks them against the model and hands them to the same dynamic batcher as every
// other request; answers come back as arrays and are encoded and sent here, again without the
// GIL. Every other call (other methods, BYTES tensors, typed contents, tensor parameters) goes to Python
// as its serialized bytes and is answered by the Python servicer, so the protocol's behaviour is
// the Python front end's. The module knows nothing of models: what a model accepts is Python's.
//
// It listens on a TCP port (--kserve-port), a unix socket (--kserve-socket), or both: one server,
// so the bounds below hold for the calls of both together.
//
// Bounds (what a client can make this port hold), checked here in C++ before a call's message is
// read, as the Python front end's interceptors check them on the main port:
// - with a token, a call whose metadata lacks it is answered UNAUTHENTICATED from its headers,
//   its message never read;
// - at most max_concurrent_calls calls are handled at once; one beyond is answered
//   RESOURCE_EXHAUSTED from its headers;
// - a call's message is read only once the ReadBudget (max_unary_held_bytes) has room for a
//   message of the largest size; the room is then cut to the message's own size and held until
//   the call is done (answered, failed or cancelled). A call that finds no room waits, unread,
//   first come first served; one call is always read while none is held.
// Once a call of at least trim_after_call_bytes is done, the Trimmer hands the freed memory back.
//
// Lifetime: a call's reactor lives until Python answers it (only an answer or a failure finishes
// it, also for a call its client cancelled); the parsed request lives as long as the arrays that
// view its bytes.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/eventfd.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <thread>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grpc_service.pb.h"

namespace py = pybind11;

namespace {

constexpr const char* kModelInfer = "/inference.GRPCInferenceService/ModelInfer";
constexpr const char* kStreamInfer = "/inference.GRPCInferenceService/ModelStreamInfer";
constexpr const char* kUnauthenticated = "missing or wrong token: send metadata 'authorization: Bearer <token>'";
constexpr const char* kShuttingDown = "the server is shutting down; retry on another";

// Whether an `authorization` value is "Bearer <token>", in time that depends on the lengths only.
bool TokenMatches(const std::string& token, grpc::string_ref authorization) {
  static constexpr char kBearer[] = "Bearer ";
  constexpr size_t kPrefix = sizeof(kBearer) - 1;
  if (authorization.size() != kPrefix + token.size()) return false;
  const char* value = authorization.data();
  unsigned char difference = 0;
  for (size_t i = 0; i < kPrefix; ++i) difference |= static_cast<unsigned char>(value[i] ^ kBearer[i]);
  for (size_t i = 0; i < token.size(); ++i) {
    difference |= static_cast<unsigned char>(value[kPrefix + i] ^ token[i]);
  }
  return difference == 0;
}

// Fixed-size KServe datatypes: numpy dtype name and item size. BYTES is not among them.
struct Datatype {
  const char* name;
  const char* numpy;
  size_t itemsize;
};
constexpr Datatype kDatatypes[] = {
    {"BOOL", "bool", 1},     {"UINT8", "uint8", 1},     {"INT8", "int8", 1},     {"INT16", "int16", 2},
    {"INT32", "int32", 4},   {"INT64", "int64", 8},     {"FP16", "float16", 2},  {"FP32", "float32", 4},
    {"FP64", "float64", 8},  {"UINT16", "uint16", 2},   {"UINT32", "uint32", 4}, {"UINT64", "uint64", 8},
};

const Datatype* FindDatatype(const std::string& name) {
  for (const auto& datatype : kDatatypes) {
    if (name == datatype.name) return &datatype;
  }
  return nullptr;
}

class Frontend;

// Hands the memory freed by large calls back to the system (glibc's malloc_trim), at most once a
// second; a trim asked for sooner runs at the end of the second, so the last call's memory goes
// back too. The twin of the Python front end's core/memory_trim.py: grpc++'s receive buffers and
// the parsed request of a call of tens of MiB come from the heap and the threads' arenas, which
// the launcher's allocator settings keep. Its own thread: a trim never delays an answer.
class Trimmer {
 public:
  explicit Trimmer(int64_t min_bytes) : min_bytes_(min_bytes) {
#ifdef __GLIBC__
    if (min_bytes_ > 0) thread_ = std::thread([this] { Loop(); });
#endif
  }
  ~Trimmer() { Stop(); }

  // A call that held `bytes` is done and its memory freed.
  void CallDone(int64_t bytes) {
    if (!thread_.joinable() || bytes < min_bytes_) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      wanted_ = true;
    }
    cv_.notify_one();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  uint64_t trims() {
    std::lock_guard<std::mutex> lock(mutex_);
    return trims_;
  }

 private:
  void Loop() {
    using Clock = std::chrono::steady_clock;
    constexpr auto kInterval = std::chrono::seconds(1);
    std::unique_lock<std::mutex> lock(mutex_);
    Clock::time_point last = Clock::now() - kInterval;
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || wanted_; });
      if (stop_ || cv_.wait_until(lock, last + kInterval, [this] { return stop_; })) return;
      wanted_ = false;
      last = Clock::now();
      lock.unlock();
#ifdef __GLIBC__
      malloc_trim(0);
#endif
      lock.lock();
      ++trims_;
    }
  }

  const int64_t min_bytes_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool wanted_ = false;
  bool stop_ = false;
  uint64_t trims_ = 0;
  std::thread thread_;
};

// A call answered from its headers alone (refused): its message is never read.
class Refusal final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

class Call;

// The bytes of this port's calls being read or read and not yet answered, and the most it holds
// (--max-unary-held-bytes). Reading a call reserves room for a message of the largest size; once
// read, the reservation is cut to the message's size; the rest is released when the call is done.
class ReadBudget {
 public:
  ReadBudget(int64_t limit_bytes, int64_t max_message_bytes)
      : limit_bytes_(limit_bytes), max_message_bytes_(max_message_bytes) {}

  // Room for `call` to read now (reserved: true), or `call` waits its turn (false) and is
  // started by `Settle`/`Release` once there is room.
  bool ReserveOrWait(Call* call);
  // `call` read its message of `size_bytes`: hold that instead of the reservation.
  void Settle(Call* call, int64_t size_bytes);
  // `call` is done: what it held is free; the bytes it held.
  int64_t Release(Call* call);
  // `call`'s client went away or the server stops: true when it was still waiting (then it never
  // reads, and its caller finishes it).
  bool Withdraw(Call* call);
  // Every call still waiting, removed (the server stops).
  std::vector<Call*> TakeWaiting();

  int64_t held_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_bytes_;
  }
  size_t waiting() {
    std::lock_guard<std::mutex> lock(mutex_);
    return waiting_.size();
  }

 private:
  bool HasRoomLocked() const { return held_bytes_ == 0 || held_bytes_ + max_message_bytes_ <= limit_bytes_; }
  void Wake();  // start the waiting calls that fit now, first come first served

  const int64_t limit_bytes_;
  const int64_t max_message_bytes_;
  std::mutex mutex_;
  int64_t held_bytes_ = 0;
  std::deque<Call*> waiting_;
};

// One call, from its first message to its answer. Only unary methods are served here.
class Call final : public grpc::ServerGenericBidiReactor {
 public:
  Call(Frontend* frontend, grpc::GenericCallbackServerContext* context, ReadBudget* budget)
      : frontend_(frontend), context_(context), budget_(budget) {
    if (budget_->ReserveOrWait(this)) StartReading();
  }

  // Read the message: the budget has reserved room for it.
  void StartReading() { StartRead(&request_buffer_); }

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool) override {}
  void OnCancel() override;  // the client went away or its deadline passed
  void OnDone() override;

  // Decode the request as the common ModelInfer request; false when it is anything else.
  bool Decode();

  void Answer(grpc::ByteBuffer response) {
    response_buffer_ = std::move(response);
    StartWriteAndFinish(&response_buffer_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void Fail(const grpc::Status& status) { Finish(status); }

  uint64_t id = 0;
  int64_t held_bytes = 0;  // of the ReadBudget, guarded by its mutex
  std::string method;
  grpc::ByteBuffer request_buffer_;
  // Shared with the numpy arrays viewing its raw contents, which may outlive the call.
  std::shared_ptr<inference::ModelInferRequest> request;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::string peer;  // gRPC's name of the client (ipv4:host:port): who registers shared memory

 private:
  Frontend* frontend_;
  grpc::GenericCallbackServerContext* context_;
  ReadBudget* budget_;
  grpc::ByteBuffer response_buffer_;
};

bool ReadBudget::ReserveOrWait(Call* call) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (waiting_.empty() && HasRoomLocked()) {
    held_bytes_ += max_message_bytes_;
    call->held_bytes = max_message_bytes_;
    return true;
  }
  waiting_.push_back(call);
  return false;
}

void ReadBudget::Settle(Call* call, int64_t size_bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_bytes_ += size_bytes - call->held_bytes;
    call->held_bytes = size_bytes;
  }
  Wake();
}

int64_t ReadBudget::Release(Call* call) {
  int64_t released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    released = call->held_bytes;
    held_bytes_ -= released;
    call->held_bytes = 0;
  }
  Wake();
  return released;
}

bool ReadBudget::Withdraw(Call* call) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (*it == call) {
      waiting_.erase(it);
      return true;
    }
  }
  return false;
}

std::vector<Call*> ReadBudget::TakeWaiting() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Call*> calls(waiting_.begin(), waiting_.end());
  waiting_.clear();
  return calls;
}

void ReadBudget::Wake() {
  std::vector<Call*> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!waiting_.empty() && HasRoomLocked()) {
      Call* call = waiting_.front();
      waiting_.pop_front();
      held_bytes_ += max_message_bytes_;
      call->held_bytes = max_message_bytes_;
      ready.push_back(call);
    }
  }
  // Outside the lock: a read may complete at once, on this thread.
  for (Call* call : ready) call->StartReading();
}

class Frontend {
 public:
  Frontend(const std::string& address, int64_t max_message_bytes, const std::string& tls_key,
           const std::string& tls_cert, const std::string& tls_client_ca, const std::string& auth_token,
           int64_t max_concurrent_calls, int64_t max_held_bytes, int64_t trim_after_call_bytes,
           const std::string& unix_address)
      : wakeup_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        token_(auth_token),
        max_concurrent_calls_(max_concurrent_calls),
        budget_(max_held_bytes, max_message_bytes),
        trimmer_(trim_after_call_bytes) {
    if (max_concurrent_calls < 1 || max_held_bytes < 1 || max_message_bytes < 1) {
      if (wakeup_fd_ >= 0) close(wakeup_fd_);
      throw std::invalid_argument("expected at least 1 concurrent call, 1 held byte and a message limit of 1 byte");
    }
    if (address.empty() && unix_address.empty()) {
      if (wakeup_fd_ >= 0) close(wakeup_fd_);
      throw std::invalid_argument("expected an address (host:port), a unix address (unix:/path), or both");
    }
    if (wakeup_fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
    std::shared_ptr<grpc::ServerCredentials> credentials;
    if (tls_cert.empty()) {
      credentials = grpc::InsecureServerCredentials();
    } else {
      grpc::SslServerCredentialsOptions options(
          tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      options.pem_key_cert_pairs.push_back({tls_key, tls_cert});
      options.pem_root_certs = tls_client_ca;
      credentials = grpc::SslServerCredentials(options);
    }
    grpc::ServerBuilder builder;
    if (!address.empty()) builder.AddListeningPort(address, credentials, &port_);
    // The unix socket is local, as the server's main socket: plaintext, protected by its file mode
    // (bound by Python in a private folder first); the token is checked on it as on the port.
    int unix_port = 0;
    if (!unix_address.empty()) builder.AddListeningPort(unix_address, grpc::InsecureServerCredentials(), &unix_port);
    builder.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // two servers must never share a port
    // No window growth by bandwidth-delay probes: a client may send a call's message up to its
    // stream's window before the call is refused from its headers, and with the probes (grpc++
    // 1.51) the windows grew so that 16 connections of calls refused unread made the process
    // hold +24 to +67 MiB at once; at HTTP/2's 64 KiB windows +0 to +1 MiB. The cost: a 60 MiB
    // message takes about 0.6 s instead of 0.4 s to arrive over loopback (docs/reliability.md).
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.RegisterCallbackGenericService(&service_);
    service_.frontend = this;
    server_ = builder.BuildAndStart();
    if (!server_ || (!address.empty() && port_ == 0) || (!unix_address.empty() && unix_port == 0)) {
      close(wakeup_fd_);
      std::string where = address.empty() ? unix_address
                          : unix_address.empty() ? address
                                                 : address + " and " + unix_address;
      throw std::runtime_error("cannot listen on " + where + ": the address is taken or not allowed");
    }
    sender_ = std::thread([this] { SendLoop(); });
  }

  ~Frontend() {
    Stop();
    close(wakeup_fd_);
  }

  int port() const { return port_; }
  int wakeup_fd() const { return wakeup_fd_; }

  // A call read its request: decode it (no GIL here) and queue it for Python.
  void Accept(Call* call) {
    bool fast = call->method == kModelInfer && call->Decode();
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      call->Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
      return;
    }
    call->id = ++last_id_;
    calls_.emplace(call->id, call);
    (fast ? fast_ : slow_).push_back(call);
    WakeLocked();
  }

  // Wake Python when the queues turn non-empty (it reads the eventfd before taking them).
  void WakeLocked() {
    if (fast_.size() + slow_.size() + cancelled_.size() == 1) {
      uint64_t one = 1;
      ssize_t written = write(wakeup_fd_, &one, sizeof(one));
      (void)written;  // the counter only saturates with a wakeup already pending
    }
  }

  void Forget(Call* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (call->id != 0) calls_.erase(call->id);
  }

  // A call not answered yet was cancelled: Python drops its work and answers it CANCELLED.
  void Cancelled(Call* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (call->id == 0 || calls_.count(call->id) == 0) return;  // not accepted yet, or answered
    cancelled_.push_back(call->id);
    WakeLocked();
  }

  // Everything queued since the last take: (fast calls, slow calls, ids of cancelled calls).
  // Never raises for one call: a fast call whose arrays numpy refuses goes to the slow path,
  // where the Python servicer's checks name what is wrong.
  py::tuple Take() {
    uint64_t count;
    ssize_t got = read(wakeup_fd_, &count, sizeof(count));
    (void)got;  // EAGAIN: nothing was pending
    std::vector<Call*> fast, slow;
    std::vector<uint64_t> cancelled;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fast.swap(fast_);
      slow.swap(slow_);
      cancelled.swap(cancelled_);
    }
    py::list fast_list;
    for (Call* call : fast) {
      try {
        fast_list.append(FastCall(call));
      } catch (const std::exception&) {
        PyErr_Clear();
        slow.push_back(call);
      }
    }
    py::list slow_list;
    for (Call* call : slow) {
      slow_list.append(py::make_tuple(call->id, call->method, RequestBytes(call), Metadata(call)));
    }
    return py::make_tuple(fast_list, slow_list, py::cast(cancelled));
  }

  // The serialized request of a call not answered yet, for Python to read as a message.
  py::bytes RequestBytesOf(uint64_t id) {
    Call* call;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = calls_.find(id);
      if (found == calls_.end()) throw std::invalid_argument("no such call: answered already");
      call = found->second;
    }
    return RequestBytes(call);
  }

  // The client of a call not answered yet, as gRPC names its peer.
  std::string PeerOf(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = calls_.find(id);
    if (found == calls_.end()) throw std::invalid_argument("no such call: answered already");
    return found->second->peer;
  }

  // Answer a fast call: outputs as (name, datatype, shape, array) in the order to send them.
  void Answer(uint64_t id, const std::string& model_name, const std::string& model_version,
              const std::string& request_id, const py::list& outputs) {
    // Built before the call is taken, since this may raise.
    auto response = std::make_unique<inference::ModelInferResponse>();
    response->set_model_name(model_name);
    response->set_model_version(model_version);
    response->set_id(request_id);
    for (const auto& item : outputs) {
      auto output = item.cast<py::tuple>();
      auto* tensor = response->add_outputs();
      tensor->set_name(output[0].cast<std::string>());
      tensor->set_datatype(output[1].cast<std::string>());
      for (const auto& dim : output[2]) tensor->add_shape(dim.cast<int64_t>());
      py::buffer_info info = output[3].cast<py::buffer>().request();
      if (info.ndim > 0 && !IsCContiguous(info)) throw std::invalid_argument("output arrays must be C-contiguous");
      response->add_raw_output_contents()->assign(static_cast<const char*>(info.ptr), info.size * info.itemsize);
    }
    Call* call = Find(id);
    if (call == nullptr) return;
    // Encoding and sending happen on the sender thread: the event loop keeps the GIL, instead
    // of handing it to the inference thread and waiting to take it back once per answer.
    {
      std::lock_guard<std::mutex> lock(send_mutex_);
      outgoing_.push_back(Outgoing{call, std::move(response)});
    }
    send_cv_.notify_one();
  }

  // The sender thread: encodes the answers Python handed over and sends them, until stopped
  // (what was handed over before is still sent).
  void SendLoop() {
    std::deque<Outgoing> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(send_mutex_);
        send_cv_.wait(lock, [this] { return sender_stop_ || !outgoing_.empty(); });
        if (outgoing_.empty()) return;  // stopping, nothing left
        batch.swap(outgoing_);
      }
      for (auto& item : batch) {
        grpc::ByteBuffer buffer;
        bool own;
        grpc::Status status =
            grpc::SerializationTraits<inference::ModelInferResponse>::Serialize(*item.response, &buffer, &own);
        if (status.ok()) {
          item.call->Answer(std::move(buffer));
        } else {
          item.call->Fail(status);
        }
      }
      batch.clear();
    }
  }

  // Answer a call with a response Python serialized.
  void AnswerBytes(uint64_t id, const py::bytes& response) {
    Call* call = Find(id);
    if (call == nullptr) return;
    std::string bytes = response;
    grpc::Slice slice(bytes);
    call->Answer(grpc::ByteBuffer(&slice, 1));
  }

  void Fail(uint64_t id, int code, const std::string& message) {
    Call* call = Find(id);
    if (call == nullptr) return;
    call->Fail(grpc::Status(static_cast<grpc::StatusCode>(code), message));
  }

  // Refuse new calls and fail those Python has not answered, then stop listening.
  void Stop() {
    std::vector<Call*> unanswered;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) return;
      stopping_ = stopped_ = true;
      for (auto& entry : calls_) unanswered.push_back(entry.second);
      calls_.clear();
      fast_.clear();
      slow_.clear();
      cancelled_.clear();
    }
    py::gil_scoped_release release;
    for (Call* call : unanswered) {
      call->id = 0;
      call->Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
    }
    for (Call* call : budget_.TakeWaiting()) {  // never read: ended here, unread
      call->Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
    }
    {
      std::lock_guard<std::mutex> lock(send_mutex_);
      sender_stop_ = true;
    }
    send_cv_.notify_one();
    if (sender_.joinable()) sender_.join();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
    trimmer_.Stop();
  }

  void StopAccepting() {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }

  size_t unanswered() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_.size();
  }

  // (calls handled now, bytes the read budget holds, calls waiting unread for room, trims done)
  py::tuple Bounds() {
    return py::make_tuple(active_calls_.load(), budget_.held_bytes(), budget_.waiting(), trimmer_.trims());
  }

 private:
  struct Service : grpc::CallbackGenericService {
    Frontend* frontend = nullptr;
    // Called once the call's headers arrived and before any of its message is read: every
    // refusal here costs the server the headers alone.
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
      return frontend->Admit(context);
    }
  };

  grpc::ServerGenericBidiReactor* Admit(grpc::GenericCallbackServerContext* context) {
    if (!token_.empty()) {
      const auto& metadata = context->client_metadata();
      auto found = metadata.find("authorization");
      if (found == metadata.end() || !TokenMatches(token_, found->second)) {
        return new Refusal(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kUnauthenticated));
      }
    }
    if (context->method() == kStreamInfer) {
      // Streams are served by the Python front end's port; a bidi proxy is future work.
      return new Refusal(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                      "ModelStreamInfer is not served by the native KServe front end; expected "
                                      "unary ModelInfer here, or the stream on the server's main gRPC port"));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return new Refusal(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
    }
    if (active_calls_.fetch_add(1) >= max_concurrent_calls_) {
      active_calls_.fetch_sub(1);
      return new Refusal(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          "the server handles --max-concurrent-calls " + std::to_string(max_concurrent_calls_) +
              " calls at once on this port; expected fewer at a time: retry after a back-off"));
    }
    return new Call(this, context, &budget_);
  }

  // A call admitted by `Admit` is done, and freed: it held `bytes` of the budget.
  void CallDone(int64_t bytes) {
    active_calls_.fetch_sub(1);
    trimmer_.CallDone(bytes);
  }

  static bool IsCContiguous(const py::buffer_info& info) {
    py::ssize_t expected = info.itemsize;
    for (py::ssize_t axis = info.ndim - 1; axis >= 0; --axis) {
      if (info.shape[axis] > 1 && info.strides[axis] != expected) return false;
      expected *= info.shape[axis];
    }
    return true;
  }

  Call* Find(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = calls_.find(id);
    if (found == calls_.end()) return nullptr;  // answered already, or failed by Stop
    Call* call = found->second;
    calls_.erase(found);
    call->id = 0;
    return call;
  }

  static py::bytes RequestBytes(Call* call) {
    std::string bytes;
    grpc::ByteBuffer copy(call->request_buffer_);  // reading consumes a reader, not the buffer
    grpc::ProtoBufferReader reader(&copy);
    const void* data;
    int size;
    while (reader.Next(&data, &size)) bytes.append(static_cast<const char*>(data), size);
    return py::bytes(bytes);
  }

  // Keys are ASCII (HTTP/2 lower-case names); a value that is not UTF-8 is decoded with
  // replacement characters rather than refused (the Python front end drops such a value).
  static py::list Metadata(Call* call) {
    py::list metadata;
    for (const auto& entry : call->metadata) {
      PyObject* value = PyUnicode_DecodeUTF8(entry.second.data(), static_cast<Py_ssize_t>(entry.second.size()),
                                             "replace");
      if (value == nullptr) throw py::error_already_set();
      metadata.append(py::make_tuple(entry.first, py::reinterpret_steal<py::str>(value)));
    }
    return metadata;
  }

  // (id, model, version, request id, inputs as (name, datatype, array), requested outputs, metadata)
  py::tuple FastCall(Call* call) {
    const auto& request = *call->request;
    py::list inputs(request.inputs_size());
    auto* shared = new std::shared_ptr<inference::ModelInferRequest>(call->request);
    py::object owner = py::capsule(shared, [](void* pointer) {
      delete static_cast<std::shared_ptr<inference::ModelInferRequest>*>(pointer);
    });
    for (int i = 0; i < request.inputs_size(); ++i) {
      const auto& tensor = request.inputs(i);
      const Datatype* datatype = FindDatatype(tensor.datatype());
      std::vector<py::ssize_t> shape(tensor.shape().begin(), tensor.shape().end());
      const std::string& raw = request.raw_input_contents(i);
      py::array array(py::dtype(datatype->numpy), shape, raw.data(), owner);
      array.attr("flags").attr("writeable") = false;  // a request is read, never written
      inputs[i] = py::make_tuple(tensor.name(), tensor.datatype(), py::tuple(py::cast(shape)), array);
    }
    py::list outputs(request.outputs_size());
    for (int i = 0; i < request.outputs_size(); ++i) outputs[i] = py::str(request.outputs(i).name());
    return py::make_tuple(call->id, request.model_name(), request.model_version(), request.id(), inputs, outputs,
                          Metadata(call));
  }

  Service service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int wakeup_fd_;
  const std::string token_;  // empty: no token required
  const int64_t max_concurrent_calls_;
  std::atomic<int64_t> active_calls_{0};
  ReadBudget budget_;
  Trimmer trimmer_;
  std::mutex mutex_;
  uint64_t last_id_ = 0;
  bool stopping_ = false;
  bool stopped_ = false;
  std::unordered_map<uint64_t, Call*> calls_;
  std::vector<Call*> fast_;
  std::vector<Call*> slow_;
  std::vector<uint64_t> cancelled_;

  struct Outgoing {
    Call* call;
    std::unique_ptr<inference::ModelInferResponse> response;
  };
  std::mutex send_mutex_;
  std::condition_variable send_cv_;
  std::deque<Outgoing> outgoing_;
  bool sender_stop_ = false;
  std::thread sender_;

  friend class Call;
};

void Call::OnReadDone(bool ok) {
  if (!ok) {
    Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call ended before its request arrived"));
    return;
  }
  budget_->Settle(this, static_cast<int64_t>(request_buffer_.Length()));
  method = context_->method();
  peer = context_->peer();
  for (const auto& entry : context_->client_metadata()) {
    std::string key(entry.first.data(), entry.first.size());
    if (key.size() > 4 && key.compare(key.size() - 4, 4, "-bin") == 0) continue;  // binary: never used
    metadata.emplace_back(std::move(key), std::string(entry.second.data(), entry.second.size()));
  }
  frontend_->Accept(this);
}

void Call::OnCancel() {
  if (budget_->Withdraw(this)) {  // it waited, unread, for room: nothing of it reached Python
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
    return;
  }
  frontend_->Cancelled(this);
}

void Call::OnDone() {
  Frontend* frontend = frontend_;
  frontend->Forget(this);
  const int64_t bytes = budget_->Release(this);
  delete this;  // its request's buffers are freed before the trim
  frontend->CallDone(bytes);
}

bool Call::Decode() {
  request = std::make_shared<inference::ModelInferRequest>();
  grpc::ProtoBufferReader reader(&request_buffer_);
  if (!request->ParseFromZeroCopyStream(&reader)) return false;
  const auto& request = *this->request;
  const int inputs = request.inputs_size();
  // Request-level parameters (such as tritonclient's triton_enable_empty_final_response) are ignored,
  // as the Python front end ignores them; a tensor's parameters are left to its checks.
  if (inputs == 0 || request.raw_input_contents_size() != inputs) return false;
  for (int i = 0; i < inputs; ++i) {
    const auto& tensor = request.inputs(i);
    const Datatype* datatype = FindDatatype(tensor.datatype());
    if (datatype == nullptr || tensor.parameters_size() != 0 || tensor.has_contents() || tensor.shape_size() == 0) {
      return false;
    }
    // numpy's limits: at most 32 dimensions, and a size (zero dimensions aside) that fits a
    // signed 64-bit count of bytes. Anything beyond goes to the Python checks, which refuse it.
    if (tensor.shape_size() > 32) return false;
    uint64_t count = 1, nonzero = datatype->itemsize;
    constexpr uint64_t kLimit = static_cast<uint64_t>(INT64_MAX);
    for (int64_t dim : tensor.shape()) {
      if (dim < 0) return false;
      const uint64_t size = static_cast<uint64_t>(dim);
      if (size != 0) {
        if (nonzero > kLimit / size) return false;
        nonzero *= size;
      }
      count = size == 0 ? 0 : count * size;  // bounded by nonzero, which did not overflow
    }
    if (count * datatype->itemsize != request.raw_input_contents(i).size()) return false;
    if (datatype->itemsize > 1 &&
        reinterpret_cast<uintptr_t>(request.raw_input_contents(i).data()) % datatype->itemsize != 0) {
      return false;  // numpy views need aligned data; the Python path copies
    }
  }
  for (const auto& output : request.outputs()) {
    if (output.parameters_size() != 0) return false;
  }
  return true;
}

}  // namespace

PYBIND11_MODULE(_kserve_frontend, module) {
  module.doc() = "The native KServe v2 gRPC front end (grpc++): see kserve_frontend.cpp.";
  py::class_<Frontend>(module, "Frontend")
      .def(py::init<const std::string&, int64_t, const std::string&, const std::string&, const std::string&,
                    const std::string&, int64_t, int64_t, int64_t, const std::string&>(),
           py::arg("address"), py::arg("max_message_bytes"), py::arg("tls_key") = "", py::arg("tls_cert") = "",
           py::arg("tls_client_ca") = "", py::arg("auth_token") = "", py::arg("max_concurrent_calls") = 1024,
           py::arg("max_held_bytes") = int64_t{256} << 20, py::arg("trim_after_call_bytes") = 0,
           py::arg("unix_address") = "",
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &Frontend::port)
      .def_property_readonly("wakeup_fd", &Frontend::wakeup_fd)
      .def("take", &Frontend::Take)
      .def("answer", &Frontend::Answer)
      .def("answer_bytes", &Frontend::AnswerBytes)
      .def("request_bytes", &Frontend::RequestBytesOf)
      .def("peer", &Frontend::PeerOf)
      .def("fail", &Frontend::Fail)
      .def("stop_accepting", &Frontend::StopAccepting)
      .def("stop", &Frontend::Stop)
      .def("unanswered", &Frontend::unanswered)
      .def("bounds", &Frontend::Bounds);
}
