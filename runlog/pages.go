package runlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// pageSlack is how much longer than a page's wait its request may take.
const pageSlack = 10 * time.Second

// PageSource reads what req names (its Kind and RunID or Session; the
// rest is the reader's) from tenant's read service,
// wf.tenant.<tenant>.runs.read, page by page: a producer's way to its own
// tenant's stored events and output.
func PageSource(nc *nats.Conn, tenant string, req schemas.RunsReadRequest) Source {
	p := &pageSource{nc: nc, service: bus.TenantSubject(tenant, bus.TenantRunsRead), req: req}
	switch req.Kind {
	case schemas.ReadEvents:
		p.subject = bus.RunEventsSubject(tenant, req.RunID)
	case schemas.ReadLogs:
		p.subject = bus.RunLogsSubject(tenant, req.RunID)
	default:
		p.subject = bus.SessionLogsSubject(tenant, req.Session)
	}
	return p
}

type pageSource struct {
	nc               *nats.Conn
	service, subject string
	req              schemas.RunsReadRequest
}

// ask sends one runs.read request and returns its page, or its refusal.
func (p *pageSource) ask(ctx context.Context, req schemas.RunsReadRequest) (schemas.ReadPage, error) {
	b, err := codec.Encode(codec.MsgPack, req)
	if err != nil {
		return schemas.ReadPage{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.WaitMillis)*time.Millisecond+pageSlack)
	defer cancel()
	m := &nats.Msg{Subject: p.service, Data: b, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, codec.MsgPack.ContentType())
	resp, err := p.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return schemas.ReadPage{}, fmt.Errorf("runlog: read %s: no answer on %s: %w", p.subject, p.service, err)
	}
	var rep schemas.Reply[schemas.ReadPage]
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &rep); err != nil {
		return schemas.ReadPage{}, fmt.Errorf("runlog: read %s: reply on %s: %w", p.subject, p.service, err)
	}
	if rep.Refusal != nil {
		return schemas.ReadPage{}, rep.Refusal
	}
	if rep.OK == nil {
		return schemas.ReadPage{}, errors.New("runlog: empty reply on " + p.service)
	}
	return *rep.OK, nil
}

func (p *pageSource) Last(ctx context.Context) (uint64, time.Time, error) {
	req := p.req
	req.Max, req.StartSeq, req.StartTime, req.WaitMillis = 0, 0, nil, 0
	page, err := p.ask(ctx, req)
	if err != nil || page.LastTime == nil {
		return page.LastSeq, time.Time{}, err
	}
	return page.LastSeq, *page.LastTime, nil
}

func (p *pageSource) Open(_ context.Context, from uint64, since time.Time) (Cursor, error) {
	return &pageCursor{src: p, next: from, since: since}, nil
}

// pageCursor yields pages' messages one at a time, asking for the next
// page from the last message's sequence on.
type pageCursor struct {
	src   *pageSource
	next  uint64    // the sequence to ask from; 0 from since, or the start
	since time.Time // until a page answered a message
	held  []schemas.StoredMsg
}

func (c *pageCursor) Next(ctx context.Context, wait time.Duration) (Msg, bool, error) {
	for len(c.held) == 0 {
		if ctx.Err() != nil {
			return Msg{}, false, ctx.Err()
		}
		req := c.src.req
		req.Max, req.StartSeq, req.StartTime = schemas.MaxReadMessages, c.next, nil
		if c.next == 0 && !c.since.IsZero() {
			req.StartTime = &c.since
		}
		poll := schemas.MaxReadWait
		if wait > 0 {
			poll = min(wait, poll)
		}
		req.WaitMillis = max(poll.Milliseconds(), 1)
		page, err := c.src.ask(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				return Msg{}, false, ctx.Err()
			}
			return Msg{}, false, err
		}
		c.held = page.Messages
		if len(c.held) == 0 && wait > 0 {
			return Msg{}, false, nil
		}
	}
	sm := c.held[0]
	c.held = c.held[1:]
	c.next, c.since = sm.Seq+1, time.Time{}
	return Msg{Subject: c.src.subject, Seq: sm.Seq, Time: sm.Time, Header: nats.Header(sm.Headers), Data: sm.Data}, true, nil
}

func (c *pageCursor) Stop() { c.held = nil }
