package nodelog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/time/rate"
)

// The log writer is what containerd's shim runs as a workload's logging
// binary (cio.BinaryIO): the shim starts `<binary> WriterFlag <spec>` with
// the workload's stdout on fd 3, its stderr on fd 4 and a pipe on fd 5
// that the writer closes once it is ready. When the task is deleted the
// shim closes the pipes and sends SIGTERM; the writer reads both streams to
// their end, marks the directory done and exits.

// WriterFlag, first in a binary's arguments, makes it a log writer. Any
// binary that calls WriterMain first thing can serve (warmfleet-agent does).
const WriterFlag = "--warmfleet-log-writer"

const probeSpec = "probe"

// Limit bounds how fast one workload's output is kept, both streams
// together; output past it is dropped and a marker line says how much.
// Zero BytesPerSecond keeps everything.
type Limit struct {
	BytesPerSecond int64
	Burst          int64 // at least one full read (64 KiB) is allowed whatever is set
}

// WriterSpec is what the writer is told: where to keep the output, and the
// workload's limit.
type WriterSpec struct {
	Dir   string
	Limit Limit
}

// ErrBadWriterSpec: a writer argument this package did not write.
var ErrBadWriterSpec = errors.New("nodelog: bad log writer spec")

// Encode renders s as the writer's argument.
func (s WriterSpec) Encode() string {
	v := url.Values{"dir": {s.Dir}}
	if s.Limit.BytesPerSecond > 0 {
		v.Set("rate", strconv.FormatInt(s.Limit.BytesPerSecond, 10))
	}
	if s.Limit.Burst > 0 {
		v.Set("burst", strconv.FormatInt(s.Limit.Burst, 10))
	}
	return v.Encode()
}

// ParseWriterSpec reads an argument Encode wrote.
func ParseWriterSpec(arg string) (WriterSpec, error) {
	v, err := url.ParseQuery(arg)
	if err != nil {
		return WriterSpec{}, fmt.Errorf("%w: %v", ErrBadWriterSpec, err)
	}
	s := WriterSpec{Dir: v.Get("dir")}
	if s.Dir == "" || !strings.HasPrefix(s.Dir, "/") {
		return WriterSpec{}, fmt.Errorf("%w: dir must be an absolute path, got %q", ErrBadWriterSpec, s.Dir)
	}
	for name, dst := range map[string]*int64{"rate": &s.Limit.BytesPerSecond, "burst": &s.Limit.Burst} {
		if raw := v.Get(name); raw != "" {
			n, err := strconv.ParseInt(raw, 10, 64)
			if err != nil || n < 0 {
				return WriterSpec{}, fmt.Errorf("%w: %s must be a non-negative byte count, got %q", ErrBadWriterSpec, name, raw)
			}
			*dst = n
		}
	}
	return s, nil
}

// WriterMain runs the log writer when args (a process's os.Args) ask for
// one, returning its exit status; ok is false when they do not.
func WriterMain(args []string) (code int, ok bool) {
	if len(args) < 2 || args[1] != WriterFlag {
		return 0, false
	}
	if len(args) != 3 {
		fmt.Fprintf(os.Stderr, "usage: %s %s SPEC\n", args[0], WriterFlag)
		return 2, true
	}
	if args[2] == probeSpec {
		fmt.Println(probeSpec + " ok")
		return 0, true
	}
	spec, err := ParseWriterSpec(args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2, true
	}
	// The shim's SIGTERM asks for the rest of the output, not for less.
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGPIPE)
	out, errOut, ready := os.NewFile(3, "stdout"), os.NewFile(4, "stderr"), os.NewFile(5, "ready")
	if err := Write(spec, [2]io.Reader{out, errOut}, func() { ready.Close() }, time.Now); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1, true
	}
	return 0, true
}

// Probe checks that binary is a log writer, so a runtime refuses to start
// rather than launch workloads whose output nobody reads.
func Probe(ctx context.Context, binary string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, WriterFlag, probeSpec).Output()
	if err != nil || strings.TrimSpace(string(out)) != probeSpec+" ok" {
		return fmt.Errorf("nodelog: %s is not a log writer (it did not answer %s %s: %v); give the warmfleet-agent binary", binary, WriterFlag, probeSpec, err)
	}
	return nil
}

// Write keeps both streams' output in spec.Dir until both end, then marks
// the directory done. ready is called once the files are open.
func Write(spec WriterSpec, streams [2]io.Reader, ready func(), now func() time.Time) error {
	if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
		return fmt.Errorf("nodelog: %w", err)
	}
	var lim *rate.Limiter
	if spec.Limit.BytesPerSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(spec.Limit.BytesPerSecond), int(max(spec.Limit.Burst, readSize)))
	}
	var sinks [2]*sink
	for _, s := range Streams {
		k, err := openSink(spec, s, lim, now)
		if err != nil {
			return err
		}
		defer k.close()
		sinks[s] = k
	}
	ready()
	var wg sync.WaitGroup
	var errs [2]error
	for _, s := range Streams {
		wg.Go(func() { errs[s] = sinks[s].copyFrom(streams[s]) })
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return err
	}
	return markDone(spec.Dir)
}

// readSize is the most one read takes from a pipe.
const readSize = 64 << 10

// sink keeps one stream: its data file and times index.
type sink struct {
	stream      Stream
	data, times *os.File
	off         int64
	endsLine    bool
	dropped     int64 // since the last marker
	lim         *rate.Limiter
	limit       Limit
	now         func() time.Time
	scratch     []byte
}

func openSink(spec WriterSpec, s Stream, lim *rate.Limiter, now func() time.Time) (*sink, error) {
	data, err := os.OpenFile(DataPath(spec.Dir, s), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("nodelog: %w", err)
	}
	times, err := os.OpenFile(timesPath(spec.Dir, s), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		data.Close()
		return nil, fmt.Errorf("nodelog: %w", err)
	}
	st, err := data.Stat()
	if err != nil {
		return nil, fmt.Errorf("nodelog: %w", err)
	}
	return &sink{stream: s, data: data, times: times, off: st.Size(), endsLine: true, lim: lim, limit: spec.Limit, now: now}, nil
}

func (k *sink) close() {
	k.data.Close()
	k.times.Close()
}

// copyFrom reads r to its end, never slower than the workload writes: what
// the limit refuses is counted and dropped, not waited for.
func (k *sink) copyFrom(r io.Reader) error {
	buf := make([]byte, readSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			k.take(buf[:n])
		}
		if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
			k.marker()
			return nil
		}
		if err != nil {
			k.marker()
			return fmt.Errorf("nodelog: read %s: %w", k.stream, err)
		}
	}
}

func (k *sink) take(p []byte) {
	if k.lim != nil && !k.lim.AllowN(k.now(), len(p)) {
		k.dropped += int64(len(p))
		return
	}
	k.marker()
	k.store(p, 0)
}

// marker writes the line that says how much was dropped since the last one.
func (k *sink) marker() {
	if k.dropped == 0 {
		return
	}
	m := fmt.Sprintf("[warmfleet: %d bytes of %s dropped: over the log rate limit of %d bytes/s (burst %d)]\n",
		k.dropped, k.stream, k.limit.BytesPerSecond, max(k.limit.Burst, readSize))
	if !k.endsLine {
		m = "\n" + m
	}
	d := k.dropped
	k.dropped = 0
	k.store([]byte(m), d)
}

// store appends p and its times record. A failed write (a full disk) is
// counted as dropped: the workload is never held up by its log.
func (k *sink) store(p []byte, dropped int64) {
	at := k.now()
	n, err := k.data.Write(p)
	if n > 0 {
		k.scratch = mark{Offset: k.off, At: at, Dropped: dropped}.append(k.scratch[:0])
		_, _ = k.times.Write(k.scratch)
		k.off += int64(n)
		k.endsLine = p[n-1] == '\n'
	}
	if err != nil {
		k.dropped += int64(len(p) - n)
	}
}
