package nvml

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/schemas"
)

// DefaultLibrary is the NVML shared library the driver installs.
const DefaultLibrary = "libnvidia-ml.so.1"

// library is the slice of NVML a probe uses: the system's (dlopen.go) or, in
// tests, a fake that drives every return code.
type library interface {
	// Init loads the library if it is not loaded yet (errLibraryNotFound
	// when it cannot be) and initialises NVML.
	Init() nvmlReturn
	Shutdown() nvmlReturn
	DriverVersion() (string, nvmlReturn)
	// CUDADriverVersion is 1000*major + 10*minor, e.g. 12040.
	CUDADriverVersion() (int, nvmlReturn)
	DeviceCount() (int, nvmlReturn)
	// Device names card i and its total memory.
	Device(i int) (model string, memoryBytes uint64, ret nvmlReturn)
	// Describe is NVML's own text for ret, or ret's name when the library
	// is not loaded.
	Describe(ret nvmlReturn) string
}

// Probe measures NVIDIA cards through NVML. Each call initialises NVML,
// reads, and shuts it down, so a driver installed or upgraded while the agent
// runs is seen at the next report. Safe for concurrent use; calls are
// serialised.
type Probe struct {
	mu  sync.Mutex
	lib library
	log *zap.Logger
}

var _ agent.AcceleratorProbe = (*Probe)(nil)

// Option configures New.
type Option func(*options)

type options struct{ library string }

// WithLibrary loads NVML from path (a file name dlopen searches for, or an
// absolute path) instead of DefaultLibrary.
func WithLibrary(path string) Option { return func(o *options) { o.library = path } }

// New returns a probe over the system's NVML. Nothing is loaded until the
// first Probe.
func New(log *zap.Logger, opts ...Option) *Probe {
	o := options{library: DefaultLibrary}
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Probe{lib: systemLibrary(o.library), log: log.With(zap.String("probe", "nvml"))}
}

// Probe states what NVML establishes about this host. It never returns an
// error and recovers from panics: every failure is stated as Established
// false, except a missing library, which is a host without the driver.
func (p *Probe) Probe(ctx context.Context) (facts schemas.AcceleratorFacts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer func() {
		// A bug here must cost one report, not the agent. (A fault inside the
		// driver itself is a signal, which no Go code can recover from.)
		if r := recover(); r != nil {
			p.log.Error("NVML probe panicked; stating nothing established", zap.Any("panic", r))
			facts = schemas.AcceleratorFacts{}
		}
	}()
	switch ret := p.lib.Init(); ret {
	case success:
	case errLibraryNotFound:
		p.log.Debug("no NVML library on this host: no NVIDIA driver", zap.Error(p.fail("init", ret)))
		return schemas.AcceleratorFacts{Established: true}
	default:
		p.log.Warn("NVML did not initialise; stating nothing established", zap.Error(p.fail("init", ret)))
		return schemas.AcceleratorFacts{}
	}
	defer func() {
		if ret := p.lib.Shutdown(); ret != success {
			p.log.Warn("NVML shutdown", zap.Error(p.fail("shutdown", ret)))
		}
	}()
	facts, err := p.measure(ctx)
	if err != nil {
		p.log.Warn("NVML probe incomplete; stating nothing established", zap.Error(err))
		return schemas.AcceleratorFacts{}
	}
	return facts
}

// measure reads the driver and the cards of an initialised NVML.
func (p *Probe) measure(ctx context.Context) (schemas.AcceleratorFacts, error) {
	driver, ret := p.lib.DriverVersion()
	if ret != success {
		return schemas.AcceleratorFacts{}, p.fail("driver version", ret)
	}
	facts := schemas.AcceleratorFacts{Established: true, Vendor: Vendor, DriverVersion: driver}
	if v, ret := p.lib.CUDADriverVersion(); ret == success {
		facts.DriverCapability = cudaCapability(v)
	} else {
		// Then a Run naming a minimum capability does not match here,
		// which is the safe direction.
		p.log.Warn("NVML CUDA driver version unknown", zap.Error(p.fail("cuda driver version", ret)))
	}
	n, ret := p.lib.DeviceCount()
	if ret != success {
		return schemas.AcceleratorFacts{}, p.fail("device count", ret)
	}
	cards := make([]card, 0, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return schemas.AcceleratorFacts{}, fmt.Errorf("nvml: reading card %d of %d: %w", i, n, err)
		}
		model, mem, ret := p.lib.Device(i)
		if ret != success {
			// A card NVML cannot read (lost, fallen off the bus) cannot run
			// work: leaving it out undercounts, never overcounts.
			p.log.Warn("NVML card unreadable; not counted", zap.Int("index", i), zap.Error(p.fail("device", ret)))
			continue
		}
		cards = append(cards, card{model: model, memoryBytes: int64(mem)})
	}
	facts.Devices = group(cards)
	return facts, nil
}

// fail describes a failed NVML call.
func (p *Probe) fail(call string, ret nvmlReturn) error {
	return fmt.Errorf("nvml %s: %s (%s, code %d)", call, p.lib.Describe(ret), ret, int32(ret))
}
