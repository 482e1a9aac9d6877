package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/schemas"
)

// newCPServeCmd is the fleet bench's control-plane process: the real
// control plane (--mode cp) or a null one (--mode null) that answers the
// same traffic doing nothing with it, the baseline. It runs apart from NATS
// so its CPU and memory are its own. Hidden: fleet starts it.
func newCPServeCmd() *cobra.Command {
	var (
		url, mode, logLevel, logFile string
		heartbeat                    time.Duration
	)
	cmd := &cobra.Command{
		Use:    "cp-serve",
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			err := cpServe(url, mode, logLevel, logFile, heartbeat)
			if err != nil {
				emit(map[string]any{"event": "error", "msg": err.Error()})
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "nats-url", "", "NATS server")
	f.StringVar(&mode, "mode", "cp", "cp or null")
	f.StringVar(&logLevel, "log-level", "info", "control-plane log level, or none")
	f.StringVar(&logFile, "log-file", os.DevNull, "control-plane log file")
	f.DurationVar(&heartbeat, "heartbeat", time.Second, "heartbeat interval nodes are told")
	return cmd
}

func cpServe(url, mode, logLevel, logFile string, heartbeat time.Duration) error {
	log, err := newFileLogger(logLevel, logFile)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	s := &cpServer{}
	conn, err := bus.Connect(url, "warmfleet-cp", log, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrSlowConsumer) {
			s.slow.Add(1)
		}
	}))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := s.start(ctx, conn, mode, heartbeat, log)
	if err != nil {
		return err
	}
	defer stop()
	emit(map[string]any{"event": "ready", "pid": os.Getpid()})
	s.serve(os.Stdin)
	return nil
}

// cpServer is cp-serve's control plane, real or null, and its counters.
type cpServer struct {
	cp              *controlplane.ControlPlane // nil for the null one
	slow            atomic.Int64               // slow-consumer errors on its connection
	heartbeats, obs atomic.Int64               // what the null one consumed
}

// start runs the control plane of mode until ctx ends; stop waits for the
// real one to return (at most 20 s) after ctx is cancelled.
func (s *cpServer) start(ctx context.Context, conn *bus.Conn, mode string, heartbeat time.Duration, log *zap.Logger) (stop func(), err error) {
	switch mode {
	case "cp":
		cctx, cancel := context.WithCancel(ctx)
		cp, err := controlplane.New(cctx, conn, controlplane.Config{HeartbeatInterval: heartbeat, OpenEnrollment: true, WaitForCapacity: true}, log)
		if err != nil {
			cancel()
			return nil, err
		}
		done := make(chan error, 1)
		go func() { done <- cp.Run(cctx) }()
		select {
		case <-cp.Ready():
		case err := <-done:
			cancel()
			return nil, err
		}
		s.cp = cp
		return func() {
			cancel()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
			}
		}, nil
	case "null":
		return nullControlPlane(ctx, conn, heartbeat, &s.heartbeats, &s.obs)
	}
	return nil, errors.New("--mode: cp or null")
}

// serve answers the bench's one-line commands on in (stats, prof-start
// PATH, prof-stop) until it closes.
func (s *cpServer) serve(in io.Reader) {
	var prof *os.File
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		verb, arg, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		switch verb {
		case "stats":
			emit(s.stats())
		case "prof-start":
			var err error
			if prof, err = os.Create(arg); err == nil {
				err = pprof.StartCPUProfile(prof)
			}
			if err != nil {
				emit(map[string]any{"event": "error", "msg": err.Error()})
				continue
			}
			emit(map[string]any{"event": "prof-started"})
		case "prof-stop":
			if prof != nil {
				pprof.StopCPUProfile()
				_ = prof.Close()
				prof = nil
			}
			emit(map[string]any{"event": "prof-stopped"})
		}
	}
}

// stats is the process's memory after a GC and the control plane's counters.
func (s *cpServer) stats() map[string]any {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st := map[string]any{"event": "stats", "heap_inuse": ms.HeapInuse, "heap_alloc": ms.HeapAlloc, "sys": ms.Sys,
		"rss": rssBytes(os.Getpid()), "goroutines": runtime.NumGoroutine(), "slow_consumer_errors": s.slow.Load(),
		"heartbeats": s.heartbeats.Load(), "observations": s.obs.Load()}
	if s.cp != nil {
		st["metrics"] = s.cp.Metrics()
	}
	return st
}

// nullControlPlane answers the fleet's traffic with the least work that
// still touches every message: enrollments get a fixed session, heartbeats
// are decoded and counted, observations are consumed from WF_OBS, decoded
// and acked. Its cost is what NATS delivery and decoding alone cost.
func nullControlPlane(ctx context.Context, conn *bus.Conn, heartbeat time.Duration, heartbeats, obs *atomic.Int64) (func(), error) {
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		return nil, err
	}
	enroll, err := conn.NC.QueueSubscribe(bus.SubjectEnroll, "warmfleet-cp", func(m *nats.Msg) {
		var req schemas.EnrollmentRequest
		enc, err := codec.DecodeMsg(m, &req)
		if err != nil {
			return
		}
		now := time.Now()
		b, err := codec.Encode(enc, schemas.Reply[schemas.Enrollment]{OK: &schemas.Enrollment{
			NodeID: req.NodeID, SessionToken: "null", SessionExpires: now.Add(time.Hour), FencingToken: 1, Generation: req.Generation,
			LeaseExpires: now.Add(5 * heartbeat), HeartbeatSeconds: max(int64(heartbeat/time.Second), 1), Consumer: bus.NodeConsumer(req.NodeID),
		}})
		if err == nil {
			_ = m.Respond(b)
		}
	})
	if err != nil {
		return nil, err
	}
	hb, err := conn.NC.QueueSubscribe(bus.SubjectHeartbeats, "warmfleet-cp", func(m *nats.Msg) {
		var h schemas.Heartbeat
		if _, err := codec.DecodeMsg(m, &h); err == nil {
			heartbeats.Add(1)
		}
	})
	if err != nil {
		return nil, err
	}
	c, err := conn.JS.CreateOrUpdateConsumer(ctx, bus.StreamObs, bus.ObsConsumerConfig())
	if err != nil {
		return nil, err
	}
	cc, err := c.Consume(func(m jetstream.Msg) {
		var o schemas.Observation
		if codec.Decode(codec.Detect(m.Headers(), m.Data()), m.Data(), &o) == nil {
			obs.Add(1)
		}
		_ = m.Ack()
	})
	if err != nil {
		return nil, err
	}
	return func() { cc.Stop(); _ = enroll.Unsubscribe(); _ = hb.Unsubscribe() }, nil
}
