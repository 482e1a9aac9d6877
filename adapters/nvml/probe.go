package nvml

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// Vendor is what a host with a working NVIDIA driver states.
const Vendor = "nvidia"

// DefaultXIDWindow is how long a probe watches for XID critical errors
// after reading the cards (see WithXIDWindow).
const DefaultXIDWindow = 200 * time.Millisecond

// ReturnError is an NVML call that did not succeed.
type ReturnError struct {
	Call string
	Ret  nvml.Return
}

func (e *ReturnError) Error() string {
	// nvml.Return's own text is NVML's nvmlErrorString when the library is
	// loaded, its constant's name otherwise.
	return fmt.Sprintf("nvml %s: %s (code %d)", e.Call, e.Ret.Error(), int32(e.Ret))
}

// fail wraps a failed call.
func fail(call string, ret nvml.Return) error { return &ReturnError{Call: call, Ret: ret} }

// Prober measures NVIDIA cards through an nvml.Interface. Each Probe
// initialises NVML, reads, and shuts it down, so a driver installed or
// upgraded between probes is seen. Safe for concurrent use; calls are
// serialised.
type Prober struct {
	mu        sync.Mutex
	lib       nvml.Interface
	log       *zap.Logger
	xidWindow time.Duration
}

// Option configures New.
type Option func(*Prober)

// WithXIDWindow sets how long each probe watches for XID critical errors
// (DefaultXIDWindow unless set; zero or less watches none). NVML reports an
// XID only to an event set registered when it happens, so a one-shot probe
// sees only those raised while it watches.
func WithXIDWindow(d time.Duration) Option { return func(p *Prober) { p.xidWindow = d } }

// New returns a prober over lib: nvml.New(...) for the system library, a
// go-nvml mock in tests. Nothing is loaded until the first Probe.
func New(lib nvml.Interface, log *zap.Logger, opts ...Option) *Prober {
	if log == nil {
		log = zap.NewNop()
	}
	p := &Prober{lib: lib, log: log.With(zap.String("probe", "nvml")), xidWindow: DefaultXIDWindow}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Probe states what NVML establishes about this host. It never returns an
// error and recovers from panics: every failure is stated as Established
// false, except a missing library, which is a host without the driver.
func (p *Prober) Probe(ctx context.Context) (facts schemas.AcceleratorFacts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer func() {
		// A bug here must cost one report. (A fault inside the driver is a
		// signal no Go code recovers from; the probe binary dies and the
		// agent states nothing established.)
		if r := recover(); r != nil {
			p.log.Error("NVML probe panicked; stating nothing established", zap.Any("panic", r))
			facts = schemas.AcceleratorFacts{}
		}
	}()
	switch ret := p.lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		p.log.Info("no NVML library on this host: no NVIDIA driver", zap.Error(fail("init", ret)))
		return schemas.AcceleratorFacts{Established: true}
	default:
		p.log.Warn("NVML did not initialise; stating nothing established", zap.Error(fail("init", ret)))
		return schemas.AcceleratorFacts{}
	}
	defer func() {
		if ret := p.lib.Shutdown(); ret != nvml.SUCCESS {
			p.log.Warn("NVML shutdown", zap.Error(fail("shutdown", ret)))
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
func (p *Prober) measure(ctx context.Context) (schemas.AcceleratorFacts, error) {
	driver, ret := p.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return schemas.AcceleratorFacts{}, fail("driver version", ret)
	}
	facts := schemas.AcceleratorFacts{Established: true, Vendor: Vendor, DriverVersion: driver}
	if v, ret := p.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		facts.DriverCapability = cudaCapability(v)
	} else {
		// Then a Run naming a minimum capability does not match here,
		// which is the safe direction.
		p.log.Warn("NVML CUDA driver version unknown", zap.Error(fail("cuda driver version", ret)))
	}
	n, ret := p.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return schemas.AcceleratorFacts{}, fail("device count", ret)
	}
	r := reader{lib: p.lib, log: p.log, ext: p.lib.Extensions()}
	handles := make([]nvml.Device, n)
	facts.Cards = make([]schemas.GPUCard, 0, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return schemas.AcceleratorFacts{}, fmt.Errorf("nvml: reading card %d of %d: %w", i, n, err)
		}
		c, h := r.card(i)
		facts.Cards = append(facts.Cards, c)
		handles[i] = h
	}
	if p.xidWindow > 0 {
		r.watchXID(ctx, facts.Cards, handles, p.xidWindow)
	}
	if err := ctx.Err(); err != nil {
		return schemas.AcceleratorFacts{}, fmt.Errorf("nvml: %w", err)
	}
	facts.Devices = schemas.GroupCards(facts.Cards)
	return facts, nil
}

// reader reads one initialised NVML.
type reader struct {
	lib nvml.Interface
	log *zap.Logger
	ext nvml.ExtendedInterface
}

// has says the loaded library exports sym. go-nvml calls NVML through
// lazily bound symbols: calling one an old driver lacks kills the process,
// so entry points newer than the oldest supported driver are looked up
// first.
func (r *reader) has(sym string) bool {
	return r.ext == nil || r.ext.LookupSymbol(sym) == nil
}

// unreadable is a card NVML lists but cannot read (lost, fallen off the
// bus): stated, unhealthy, and never counted in Devices.
func unreadable(i int, err error) schemas.GPUCard {
	return schemas.GPUCard{Index: i, Health: "unreadable: " + err.Error()}
}

// unhealthy adds reason to why c should take no new work.
func unhealthy(c *schemas.GPUCard, reason string) {
	if c.Healthy() {
		c.Health = reason
		return
	}
	c.Health += "; " + reason
}

// card reads card i, returning its handle (nil when unreadable).
func (r *reader) card(i int) (schemas.GPUCard, nvml.Device) {
	log := r.log.With(zap.Int("index", i))
	dev, ret := r.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		err := fail("device handle", ret)
		log.Warn("NVML card unreadable; stated unhealthy and not counted", zap.Error(err))
		return unreadable(i, err), nil
	}
	name, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		err := fail("device name", ret)
		log.Warn("NVML card unreadable; stated unhealthy and not counted", zap.Error(err))
		return unreadable(i, err), nil
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		err := fail("device uuid", ret)
		log.Warn("NVML card has no UUID; stated unhealthy and not counted", zap.Error(err))
		return unreadable(i, err), nil
	}
	c := schemas.GPUCard{Index: i, UUID: uuid, Model: name, Health: schemas.GPUHealthOK}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		c.MemoryBytes = int64(mem.Total)
	} else {
		// Some cards do not report memory; still a card of that model.
		log.Debug("NVML card memory unknown", zap.Error(fail("memory info", ret)))
	}
	c.MIGMode = r.migMode(dev, log)
	if c.MIGMode == schemas.MIGEnabled {
		c.MIGDevices = r.migDevices(dev, c.MemoryBytes, log)
	}
	for _, reason := range r.health(dev, log) {
		unhealthy(&c, reason)
	}
	return c, dev
}

// migMode is the card's current MIG mode; "" when it has none.
func (r *reader) migMode(dev nvml.Device, log *zap.Logger) schemas.MIGMode {
	if !r.has("nvmlDeviceGetMigMode") {
		return ""
	}
	current, _, ret := dev.GetMigMode()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		return ""
	case ret != nvml.SUCCESS:
		log.Warn("NVML MIG mode unknown", zap.Error(fail("mig mode", ret)))
		return ""
	case current == nvml.DEVICE_MIG_ENABLE:
		return schemas.MIGEnabled
	}
	return schemas.MIGDisabled
}

// Application XIDs: errors a workload causes (e.g. 13, a graphics engine
// exception; 31, a memory page fault; 43, a stopped kernel), which say
// nothing about the card. NVIDIA's Kubernetes device plugin skips the same
// list.
var applicationXIDs = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

// health is why the card is unfit for new work; none when it is fit. A
// check the card or driver does not support is skipped.
func (r *reader) health(dev nvml.Device, log *zap.Logger) []string {
	var reasons []string
	if r.has("nvmlDeviceGetRetiredPagesPendingStatus") {
		switch st, ret := dev.GetRetiredPagesPendingStatus(); {
		case ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED:
			reasons = append(reasons, "retired pages pending: the card needs a reset")
		case ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED:
			log.Debug("NVML retired pages unknown", zap.Error(fail("retired pages pending status", ret)))
		}
	}
	if r.has("nvmlDeviceGetRemappedRows") {
		switch _, _, pending, failed, ret := dev.GetRemappedRows(); {
		case ret != nvml.SUCCESS:
			if ret != nvml.ERROR_NOT_SUPPORTED {
				log.Debug("NVML remapped rows unknown", zap.Error(fail("remapped rows", ret)))
			}
		case failed:
			reasons = append(reasons, "row remapping failed: the card needs service")
		case pending:
			reasons = append(reasons, "remapped rows pending: the card needs a reset")
		}
	}
	return reasons
}

// watchXID watches for XID critical errors on the readable cards for up to
// window, marking a card unhealthy for each it raises.
func (r *reader) watchXID(ctx context.Context, cards []schemas.GPUCard, handles []nvml.Device, window time.Duration) {
	if !r.has("nvmlEventSetCreate") {
		return
	}
	set, ret := r.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		r.log.Warn("NVML event set; XID errors not watched", zap.Error(fail("event set create", ret)))
		return
	}
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			r.log.Debug("NVML event set free", zap.Error(fail("event set free", ret)))
		}
	}()
	byUUID := map[string]*schemas.GPUCard{}
	for i, h := range handles {
		if h == nil {
			continue
		}
		switch ret := h.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret {
		case nvml.SUCCESS:
			byUUID[cards[i].UUID] = &cards[i]
		case nvml.ERROR_NOT_SUPPORTED:
		default:
			r.log.Debug("NVML XID events not watched on a card", zap.Int("index", i), zap.Error(fail("register events", ret)))
		}
	}
	if len(byUUID) == 0 {
		return
	}
	deadline := time.Now().Add(window)
	for ctx.Err() == nil {
		left := time.Until(deadline).Milliseconds()
		if left <= 0 {
			return
		}
		ev, ret := set.Wait(uint32(left))
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			return
		default:
			r.log.Warn("NVML event wait", zap.Error(fail("event set wait", ret)))
			return
		}
		if ev.EventType != nvml.EventTypeXidCriticalError || applicationXIDs[ev.EventData] || ev.Device == nil {
			continue
		}
		uuid, ret := ev.Device.GetUUID()
		c := byUUID[uuid]
		if ret != nvml.SUCCESS || c == nil {
			continue
		}
		reason := fmt.Sprintf("XID %d critical error", ev.EventData)
		r.log.Warn("NVML XID critical error; card stated unhealthy", zap.Int("index", c.Index), zap.String("uuid", uuid), zap.Uint64("xid", ev.EventData))
		unhealthy(c, reason)
	}
}

// errNoProfile: a MIG device whose profile NVML does not list.
var errNoProfile = errors.New("no matching profile")
