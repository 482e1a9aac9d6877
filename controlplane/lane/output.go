package lane

import (
	"context"
	"strconv"
	"time"

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
			msg := bus.LogChunkMsg(subject, r.AttemptID, s.name, r.NodeID, 0, x.ObservedAt, s.data)
			if _, err := m.conn.JS.PublishMsg(pctx, msg, jetstream.WithMsgID(bus.LogMsgID(r.AttemptID, s.name, 0))); err != nil {
				return err
			}
		}
		end := bus.LogEndMsg(subject, r.AttemptID, s.name, r.NodeID, int64(len(s.data)))
		if _, err := m.conn.JS.PublishMsg(pctx, end, jetstream.WithMsgID(bus.LogEndMsgID(r.AttemptID, s.name))); err != nil {
			return err
		}
	}
	return nil
}
