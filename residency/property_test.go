package residency

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"pgregory.net/rapid"
)

// TestProperty_EpochsAndSingleConsumer runs random interleavings of attach,
// heartbeat, time passing (leases expiring) and release on two hosts sharing
// one session, with work published throughout, against the real KV stores
// and inbox on an embedded NATS, with a fake clock and a fake runtime.
//
// After every step: the epoch in wf_residency never decreased and no epoch
// was published after its tombstone; the inbox consumers of two grants never
// ran at the same time; and a grant that handled work was never followed by
// an earlier one. At the end one host takes the session and every message
// published is handled exactly once.
//
// Time moves in steps of TTL/10, below the holder's margin (TTL/5), and
// after each step the test waits (bounded) until every consumer whose grant
// the step ended has stopped: that wait stands for the margin's real time,
// during which no other host can acquire the lease.
func TestProperty_EpochsAndSingleConsumer(t *testing.T) {
	env := newBus(t)
	rlog := watchResidency(t, env)
	const ttl = time.Second
	target := RuntimeTarget{
		Image:          "localhost/fake@sha256:" + strings.Repeat("a", 64),
		ManifestDigest: "sha256:" + strings.Repeat("a", 64), CompatibilityID: compatA,
	}
	var (
		iteration, handoffs, maxEpoch, handledTotal, staleRefusals int
	)
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		ctx := testCtx(t)
		key := Key{tenant, fmt.Sprintf("p%04d", iteration)}
		clock := newFakeClock()
		cp := newControlPlane(t, env, clock, ttl, 2*time.Second)
		durable := newMemDurable()
		durable.seed(key, compatA)
		rec := &recorder{gate: &clock.gate}
		cons := newConsumption()
		hosts := make([]*host, 2)
		for i := range hosts {
			id := fmt.Sprintf("h%d", i)
			hosts[i] = newHost(t, hostConfig{
				id: id, cp: cp, env: env, durable: durable, runtime: newFakeRuntime(), target: target,
				handler: rec.handler(id), clock: clock, heartbeat: 1000 * time.Hour, logger: zap.NewNop(),
				hooks: Hooks{OnConsume: cons.hook(id)},
			})
		}
		defer func() {
			for _, h := range hosts {
				h.mgr.Close()
			}
		}()
		byID := func(id string) *host {
			for _, h := range hosts {
				if h.id == id {
					return h
				}
			}
			return nil
		}
		// settle waits until every running consumer of key belongs to a
		// grant that is still valid.
		settle := func() {
			deadline := time.Now().Add(3 * time.Second)
			for {
				stale := ""
				for _, g := range cons.running(key) {
					hostID, epoch, _ := strings.Cut(g, "/e")
					s, ok := byID(hostID).mgr.lookup(key)
					if !ok || fmt.Sprint(s.lease.Epoch()) != epoch || s.fence.Check() != nil {
						stale = g
					}
				}
				if stale == "" {
					return
				}
				if time.Now().After(deadline) {
					rt.Fatalf("consumer %s still running 3s after its grant ended", stale)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		advance := func(tenths int) {
			for range tenths {
				clock.Advance(ttl / 10)
				settle()
			}
		}
		var ids []string
		pick := func(rt *rapid.T) *host { return hosts[rapid.IntRange(0, 1).Draw(rt, "host")] }

		rt.Repeat(map[string]func(*rapid.T){
			"attach": func(rt *rapid.T) {
				h := pick(rt)
				_, err := h.mgr.Attach(ctx, request(key, ModeResume))
				var ae *AttachError
				switch {
				case err == nil:
				case errors.As(err, &ae) && (ae.Code == CodeLeaseHeld || ae.Code == CodeBusy):
					if !ae.TookNothing() {
						rt.Fatalf("refusal took something: %v", ae)
					}
				default:
					rt.Fatalf("attach on %s: %v", h.id, err)
				}
			},
			"heartbeat": func(rt *rapid.T) {
				h := pick(rt)
				if s, ok := h.mgr.lookup(key); ok && s.phase() == PhaseResident {
					s.beat(ctx, time.Second)
				}
			},
			"advance": func(rt *rapid.T) {
				advance(rapid.IntRange(1, 12).Draw(rt, "tenths"))
			},
			"release": func(rt *rapid.T) {
				h := pick(rt)
				err := h.mgr.Release(ctx, key)
				var re *ReleaseError
				switch {
				case err == nil, errors.Is(err, ErrNotResident):
				case errors.As(err, &re) && re.Aborted && errors.Is(err, ErrStaleEpoch):
					// The grant ended under the release: surrender follows.
				default:
					rt.Fatalf("release on %s: %v", h.id, err)
				}
			},
			"publish": func(rt *rapid.T) {
				id := fmt.Sprintf("%s-m%03d", key.Session, len(ids))
				if err := publishWork(ctx, env.js, key, id); err != nil {
					rt.Fatal(err)
				}
				ids = append(ids, id)
			},
			"": func(rt *rapid.T) {
				if err := rlog.check(key); err != nil {
					rt.Fatal(err)
				}
				if err := cons.check(); err != nil {
					rt.Fatal(err)
				}
				if err := rec.checkTurns(); err != nil {
					rt.Fatal(err)
				}
			},
		})

		// Every grant lapses; then one host takes the session and the inbox
		// empties, each message handled exactly once.
		advance(25)
		waitFor(t, "surrenders", 5*time.Second, func() bool {
			return len(hosts[0].mgr.Residencies())+len(hosts[1].mgr.Residencies()) == 0
		})
		if _, err := hosts[0].mgr.Attach(ctx, request(key, ModeResume)); err != nil {
			rt.Fatalf("final attach: %v", err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(rec.snapshot()) < len(ids) {
			if time.Now().After(deadline) {
				rt.Fatalf("%d of %d messages handled", len(rec.snapshot()), len(ids))
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
		if err := rec.checkOnce(ids); err != nil {
			rt.Fatal(err)
		}
		if err := cons.check(); err != nil {
			rt.Fatal(err)
		}
		if err := rlog.check(key); err != nil {
			rt.Fatal(err)
		}
		hist := rlog.history(key)
		last := hist[len(hist)-1].Epoch
		maxEpoch = max(maxEpoch, int(last))
		prevHost := ""
		for _, o := range hist {
			if o.State == StateResident && prevHost != "" && o.Host != prevHost {
				handoffs++
			}
			if o.State == StateResident {
				prevHost = o.Host
			}
		}
		handledTotal += len(ids)
		staleRefusals += int(rec.refused.Load())
	})
	t.Logf("%d interleavings: highest epoch %d, %d hand-offs between hosts, %d messages each handled once, %d handler refusals under a stale fence",
		iteration, maxEpoch, handoffs, handledTotal, staleRefusals)
}
