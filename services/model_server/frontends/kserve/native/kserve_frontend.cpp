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
// Lifetime: a call's reactor lives until Python answers it (only an answer or a failure finishes
// it, also for a call its client cancelled); the parsed request lives as long as the arrays that
// view its bytes.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <cerrno>
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

// One call, from its first message to its answer. Only unary methods are served here.
class Call final : public grpc::ServerGenericBidiReactor {
 public:
  Call(Frontend* frontend, grpc::GenericCallbackServerContext* context) : frontend_(frontend), context_(context) {
    StartRead(&request_buffer_);
  }

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
  std::string method;
  grpc::ByteBuffer request_buffer_;
  // Shared with the numpy arrays viewing its raw contents, which may outlive the call.
  std::shared_ptr<inference::ModelInferRequest> request;
  std::vector<std::pair<std::string, std::string>> metadata;

 private:
  Frontend* frontend_;
  grpc::GenericCallbackServerContext* context_;
  grpc::ByteBuffer response_buffer_;
};

class Frontend {
 public:
  Frontend(const std::string& address, int64_t max_message_bytes, const std::string& tls_key,
           const std::string& tls_cert, const std::string& tls_client_ca)
      : wakeup_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
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
    builder.AddListeningPort(address, credentials, &port_);
    builder.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // two servers must never share a port
    builder.RegisterCallbackGenericService(&service_);
    service_.frontend = this;
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      close(wakeup_fd_);
      throw std::runtime_error("cannot listen on " + address + ": the address is taken or not allowed");
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
      call->Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down; retry on another"));
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
      call->Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down; retry on another"));
    }
    {
      std::lock_guard<std::mutex> lock(send_mutex_);
      sender_stop_ = true;
    }
    send_cv_.notify_one();
    if (sender_.joinable()) sender_.join();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }

  void StopAccepting() {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }

  size_t unanswered() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_.size();
  }

 private:
  struct Service : grpc::CallbackGenericService {
    Frontend* frontend = nullptr;
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
      if (context->method() == kStreamInfer) {
        // Streams are served by the Python front end's port; a bidi proxy is future work.
        class Refuse : public grpc::ServerGenericBidiReactor {
         public:
          Refuse() {
            Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                "ModelStreamInfer is not served by the native KServe front end; expected "
                                "unary ModelInfer here, or the stream on the server's main gRPC port"));
          }
          void OnDone() override { delete this; }
        };
        return new Refuse();
      }
      return new Call(frontend, context);
    }
  };

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
  method = context_->method();
  for (const auto& entry : context_->client_metadata()) {
    std::string key(entry.first.data(), entry.first.size());
    if (key.size() > 4 && key.compare(key.size() - 4, 4, "-bin") == 0) continue;  // binary: never used
    metadata.emplace_back(std::move(key), std::string(entry.second.data(), entry.second.size()));
  }
  frontend_->Accept(this);
}

void Call::OnCancel() { frontend_->Cancelled(this); }

void Call::OnDone() {
  frontend_->Forget(this);
  delete this;
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
      .def(py::init<const std::string&, int64_t, const std::string&, const std::string&, const std::string&>(),
           py::arg("address"), py::arg("max_message_bytes"), py::arg("tls_key") = "", py::arg("tls_cert") = "",
           py::arg("tls_client_ca") = "", py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &Frontend::port)
      .def_property_readonly("wakeup_fd", &Frontend::wakeup_fd)
      .def("take", &Frontend::Take)
      .def("answer", &Frontend::Answer)
      .def("answer_bytes", &Frontend::AnswerBytes)
      .def("request_bytes", &Frontend::RequestBytesOf)
      .def("fail", &Frontend::Fail)
      .def("stop_accepting", &Frontend::StopAccepting)
      .def("stop", &Frontend::Stop)
      .def("unanswered", &Frontend::unanswered);
}
