package containerd

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// launchSteps times the steps of one Launch, for a debug log: where a slow
// start goes is otherwise invisible from outside the adapter.
type launchSteps struct {
	last  time.Time
	start time.Time
	names []string
	took  []time.Duration
}

func newLaunchSteps() *launchSteps {
	now := time.Now()
	return &launchSteps{last: now, start: now}
}

// mark ends the step called name.
func (s *launchSteps) mark(name string) {
	now := time.Now()
	s.names, s.took = append(s.names, name), append(s.took, now.Sub(s.last))
	s.last = now
}

func (s *launchSteps) fields() zap.Field {
	return zap.Object("steps", zapcore.ObjectMarshalerFunc(func(enc zapcore.ObjectEncoder) error {
		for i, n := range s.names {
			enc.AddDuration(n, s.took[i])
		}
		enc.AddDuration("total", s.last.Sub(s.start))
		return nil
	}))
}
