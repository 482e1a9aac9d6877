package bus

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus/codec"
)

// Respond answers a core NATS request with v in enc, naming the encoding
// in the Content-Type header. A message without a reply subject is
// answered with nothing, and one whose reply subject is not an inbox is
// refused: nats-server checks no permission on a reply subject, and the
// answering side (the control plane) may publish anywhere, so a caller
// could otherwise have its answer written into a stream or bucket it
// cannot reach itself ($KV.wf_secrets.…, another tenant's subjects).
func Respond(m *nats.Msg, enc codec.Encoding, v any) error {
	if m.Reply == "" {
		return nil
	}
	if !IsInbox(m.Reply) {
		return fmt.Errorf("bus: reply subject %q is not an inbox (_INBOX.… or %s…): not answered", m.Reply, inboxRoot)
	}
	b, err := codec.Encode(enc, v)
	if err != nil {
		return fmt.Errorf("bus: encode reply: %w", err)
	}
	out := &nats.Msg{Subject: m.Reply, Data: b, Header: nats.Header{}}
	out.Header.Set(codec.ContentTypeHeader, enc.ContentType())
	return m.RespondMsg(out)
}

// ControlPlaneQueue is the queue group the control plane's replicas share,
// so each request is answered by one of them.
const ControlPlaneQueue = "warmfleet-cp"

// Subscriptions are core NATS subscriptions stopped together.
type Subscriptions []*nats.Subscription

// Stop unsubscribes every subscription.
func (s Subscriptions) Stop() {
	for _, sub := range s {
		_ = sub.Unsubscribe()
	}
}

// QueueSubscribeAll subscribes each handler in the control plane's queue
// group and returns once the server holds every subscription, so a request
// sent from any connection after it returns finds its responder. On
// failure it stops the subscriptions it made and returns the error.
func QueueSubscribeAll(nc *nats.Conn, handlers map[string]nats.MsgHandler) (Subscriptions, error) {
	var subs Subscriptions
	for subj, h := range handlers {
		s, err := nc.QueueSubscribe(subj, ControlPlaneQueue, h)
		if err != nil {
			subs.Stop()
			return nil, fmt.Errorf("bus: subscribe %s: %w", subj, err)
		}
		subs = append(subs, s)
	}
	// The subscriptions travel to the server asynchronously; a request from
	// another connection could otherwise meet "no responders".
	if err := nc.Flush(); err != nil {
		subs.Stop()
		return nil, fmt.Errorf("bus: flush subscriptions: %w", err)
	}
	return subs, nil
}

// IsInbox reports whether subject is a reply inbox: the default _INBOX.
// prefix or a restricted identity's _WF_INBOX. branch. No stream captures
// either.
func IsInbox(subject string) bool {
	return strings.HasPrefix(subject, nats.InboxPrefix) || strings.HasPrefix(subject, inboxRoot)
}
