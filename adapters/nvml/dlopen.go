//go:build cgo

package nvml

/*
#cgo linux LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// NVML's ABI, as its header declares it: nvmlReturn_t is an enum (int),
// nvmlDevice_t an opaque pointer, nvmlMemory_t three unsigned long longs.
typedef int wf_ret;
typedef void *wf_device;
typedef struct { unsigned long long total, free, used; } wf_memory;

// wf_open dlopens path, copying dlerror's text in the same call: dlerror is
// per thread, and two cgo calls may run on two threads.
static void *wf_open(const char *path, char *err, size_t n) {
	void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		strncpy(err, e ? e : "dlopen failed", n - 1);
		err[n - 1] = 0;
	}
	return h;
}

static void *wf_sym(void *h, const char *name) { return dlsym(h, name); }

// Each call goes through a pointer dlsym returned, never a symbol the
// program links against: the binary then has no undefined NVML symbols,
// and starts on hosts without the driver even when linked with -z now
// (which Go does whenever the stdlib plugin package is linked in, as
// containerd's client does).
static wf_ret wf_call(void *f) { return ((wf_ret (*)(void))f)(); }
static wf_ret wf_call_str(void *f, char *buf, unsigned int n) { return ((wf_ret (*)(char *, unsigned int))f)(buf, n); }
static wf_ret wf_call_int(void *f, int *out) { return ((wf_ret (*)(int *))f)(out); }
static wf_ret wf_call_uint(void *f, unsigned int *out) { return ((wf_ret (*)(unsigned int *))f)(out); }
static wf_ret wf_call_handle(void *f, unsigned int i, wf_device *out) { return ((wf_ret (*)(unsigned int, wf_device *))f)(i, out); }
static wf_ret wf_call_dev_str(void *f, wf_device d, char *buf, unsigned int n) { return ((wf_ret (*)(wf_device, char *, unsigned int))f)(d, buf, n); }
static wf_ret wf_call_dev_mem(void *f, wf_device d, wf_memory *m) { return ((wf_ret (*)(wf_device, wf_memory *))f)(d, m); }
static const char *wf_call_errstr(void *f, wf_ret r) { return ((const char *(*)(wf_ret))f)(r); }
*/
import "C"

import (
	"bytes"
	"unsafe"
)

// Buffer sizes from nvml.h (NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE,
// NVML_DEVICE_NAME_V2_BUFFER_SIZE).
const (
	driverVersionBuf = 80
	deviceNameBuf    = 96
)

// dlLibrary is the system's libnvidia-ml, opened on the first Init and kept
// open: unloading a driver library whose threads may still run is not worth
// the memory. The Probe that owns it serialises every call.
type dlLibrary struct {
	path    string
	handle  unsafe.Pointer
	loadErr string
	fn      struct {
		init, shutdown, errorString, driverVersion, cudaVersion, deviceCount, handleByIndex, name, memory unsafe.Pointer
	}
}

func systemLibrary(path string) library { return &dlLibrary{path: path} }

func (l *dlLibrary) Init() nvmlReturn {
	if l.handle == nil {
		if ret := l.load(); ret != success {
			return ret
		}
	}
	return nvmlReturn(C.wf_call(l.fn.init))
}

// load opens the library and resolves every entry point, preferring the
// versioned names NVML's header maps to. Any dlopen failure is a host
// without a usable library; a library lacking a required entry point is a
// driver this package cannot read.
func (l *dlLibrary) load() nvmlReturn {
	cpath := C.CString(l.path)
	defer C.free(unsafe.Pointer(cpath))
	var errBuf [256]C.char
	h := C.wf_open(cpath, &errBuf[0], C.size_t(len(errBuf)))
	if h == nil {
		l.loadErr = C.GoString(&errBuf[0])
		return errLibraryNotFound
	}
	required := []struct {
		dst   *unsafe.Pointer
		names []string
	}{
		{&l.fn.init, []string{"nvmlInit_v2", "nvmlInit"}},
		{&l.fn.shutdown, []string{"nvmlShutdown"}},
		{&l.fn.errorString, []string{"nvmlErrorString"}},
		{&l.fn.driverVersion, []string{"nvmlSystemGetDriverVersion"}},
		{&l.fn.deviceCount, []string{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}},
		{&l.fn.handleByIndex, []string{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"}},
		{&l.fn.name, []string{"nvmlDeviceGetName"}},
		{&l.fn.memory, []string{"nvmlDeviceGetMemoryInfo"}},
	}
	for _, r := range required {
		if *r.dst = sym(h, r.names...); *r.dst == nil {
			l.loadErr = "library lacks " + r.names[0]
			l.fn = struct {
				init, shutdown, errorString, driverVersion, cudaVersion, deviceCount, handleByIndex, name, memory unsafe.Pointer
			}{}
			return errFunctionNotFound
		}
	}
	// Optional: an old driver without it states no capability.
	l.fn.cudaVersion = sym(h, "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion")
	l.handle, l.loadErr = h, ""
	return success
}

func sym(h unsafe.Pointer, names ...string) unsafe.Pointer {
	for _, n := range names {
		cn := C.CString(n)
		p := C.wf_sym(h, cn)
		C.free(unsafe.Pointer(cn))
		if p != nil {
			return p
		}
	}
	return nil
}

func (l *dlLibrary) Shutdown() nvmlReturn {
	if l.handle == nil {
		return errUninitialized
	}
	return nvmlReturn(C.wf_call(l.fn.shutdown))
}

func (l *dlLibrary) DriverVersion() (string, nvmlReturn) {
	var buf [driverVersionBuf]byte
	ret := nvmlReturn(C.wf_call_str(l.fn.driverVersion, (*C.char)(unsafe.Pointer(&buf[0])), C.uint(len(buf))))
	return cString(buf[:]), ret
}

func (l *dlLibrary) CUDADriverVersion() (int, nvmlReturn) {
	if l.fn.cudaVersion == nil {
		return 0, errFunctionNotFound
	}
	var v C.int
	ret := nvmlReturn(C.wf_call_int(l.fn.cudaVersion, &v))
	return int(v), ret
}

func (l *dlLibrary) DeviceCount() (int, nvmlReturn) {
	var n C.uint
	ret := nvmlReturn(C.wf_call_uint(l.fn.deviceCount, &n))
	return int(n), ret
}

func (l *dlLibrary) Device(i int) (string, uint64, nvmlReturn) {
	var d C.wf_device
	if ret := nvmlReturn(C.wf_call_handle(l.fn.handleByIndex, C.uint(i), &d)); ret != success {
		return "", 0, ret
	}
	var name [deviceNameBuf]byte
	if ret := nvmlReturn(C.wf_call_dev_str(l.fn.name, d, (*C.char)(unsafe.Pointer(&name[0])), C.uint(len(name)))); ret != success {
		return "", 0, ret
	}
	var m C.wf_memory
	if ret := nvmlReturn(C.wf_call_dev_mem(l.fn.memory, d, &m)); ret != success {
		// Some cards do not report memory; still a card of that model.
		return cString(name[:]), 0, success
	}
	return cString(name[:]), uint64(m.total), success
}

func (l *dlLibrary) Describe(ret nvmlReturn) string {
	if l.handle == nil {
		if l.loadErr != "" {
			return l.loadErr
		}
		return ret.String()
	}
	return C.GoString(C.wf_call_errstr(l.fn.errorString, C.wf_ret(ret)))
}

// cString is buf up to its first NUL.
func cString(buf []byte) string {
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		buf = buf[:i]
	}
	return string(buf)
}
