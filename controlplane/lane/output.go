package lane

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// store keeps what an ended execution returned as its attempt's output in
// WF_LOGS, as a node's shipper would: its output on stdout, the provider's
// error on stderr, each stream closed. Every message has its id, so a
// pass that stores it again stores nothing twice.
func (m *Manager) store(ctx context.Context, r schemas.Run, x ephemeral.Execution) error {
	streams := []struct {
		name string
		data []byte
	}{{bus.LogStdout, x.Output}, {bus.LogStderr, []byte(x.Error)}}
	if x.Truncated {
		streams[1].data = append(streams[1].data, []byte("\n[warmfleet: the execution's output was cut at "+strconv.Itoa(ephemeral.MaxOutputBytes)+" bytes]\n")...)
	}
	subject := bus.RunLogsSubject(r.TenantOf(), r.ID)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, s := range streams {
		if len(s.data) > 0 {
			msg := m.logMsg(subject, r, s.name)
			msg.Data = s.data
			msg.Header.Set(bus.HeaderLogOffset, "0")
			msg.Header.Set(bus.HeaderLogTime, x.ObservedAt.UTC().Format(time.RFC3339Nano))
			if _, err := m.conn.JS.PublishMsg(pctx, msg, jetstream.WithMsgID(bus.LogMsgID(r.AttemptID, s.name, 0))); err != nil {
				return err
			}
		}
		end := m.logMsg(subject, r, s.name)
		end.Header.Set(bus.HeaderLogEnd, strconv.Itoa(len(s.data)))
		if _, err := m.conn.JS.PublishMsg(pctx, end, jetstream.WithMsgID(bus.LogEndMsgID(r.AttemptID, s.name))); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) logMsg(subject string, r schemas.Run, stream string) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Header.Set(bus.HeaderLogAttempt, r.AttemptID)
	msg.Header.Set(bus.HeaderLogStream, stream)
	msg.Header.Set(bus.HeaderLogNode, r.NodeID)
	return msg
}
