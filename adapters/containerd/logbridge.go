package containerd

import (
	"context"
	"fmt"
	"io"

	clog "github.com/containerd/log"
	"github.com/sirupsen/logrus"
	"go.uber.org/zap"
)

// The containerd client logs through logrus (e.g. the registry resolver's
// "trying next host"), by default to the process's stderr. withClientLog
// routes those lines into the adapter's zap logger instead.

// newClientLog returns a logrus entry that writes nothing itself and hands
// every line to log. The client's info lines are chatter to us: debug.
func newClientLog(log *zap.Logger) *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.DebugLevel)
	l.AddHook(zapHook{log: log.Named("client")})
	return logrus.NewEntry(l)
}

type zapHook struct{ log *zap.Logger }

func (zapHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h zapHook) Fire(e *logrus.Entry) error {
	fields := make([]zap.Field, 0, len(e.Data))
	for k, v := range e.Data {
		if err, ok := v.(error); ok {
			fields = append(fields, zap.NamedError(k, err))
			continue
		}
		fields = append(fields, zap.String(k, fmt.Sprint(v)))
	}
	switch {
	case e.Level <= logrus.ErrorLevel:
		h.log.Error(e.Message, fields...)
	case e.Level == logrus.WarnLevel:
		h.log.Warn(e.Message, fields...)
	default:
		h.log.Debug(e.Message, fields...)
	}
	return nil
}

// withClientLog makes client calls under ctx log through the bridge.
func withClientLog(ctx context.Context, entry *logrus.Entry) context.Context {
	return clog.WithLogger(ctx, entry)
}
