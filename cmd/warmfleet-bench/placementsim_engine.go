package main

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/queue"
	"github.com/warmfleet/warmfleet/schemas"
)

// simEpoch is the simulated clock's zero: trace seconds count from it.
func simEpoch() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }

// simRunState is what happened to one Run.
type simRunState struct {
	node   int // -1 until booked
	cards  []string
	queued bool // it waited in a busy node's queue
	// fetchFirst: booked on a node with free cards to fetch its bytes
	// first, claiming cards only once they were there.
	fetchFirst bool
	cardsAt    float64 // when it got its cards
	readyAt    float64 // when its bytes were all on the node
	// runningAt is when it started: its cards and its bytes both there.
	runningAt     float64
	pulled, fetch int64
	done          bool
	// expectReady is when the policy expected its bytes there at booking
	// (what the scheduler's snapshot knows; readyAt is the truth).
	expectReady float64
}

// simulator runs one policy over one trace: a discrete-event simulation
// whose events are arrivals, ends and a booked Run's bytes arriving; at
// each it does what a scheduling pass does (start queued Runs whose bytes
// are there and that now fit, then place waiting Runs oldest first).
type simulator struct {
	trace    *simTrace
	cat      simCatalogue
	runs     []simRun
	state    []simRunState
	nodes    []*simNode
	nodePos  map[string]int
	accel    []schemas.AcceleratorFacts
	locality []schemas.ImageLocality // per image, as a node reports it hot
	cfg      placement.Config
	policy   simPolicy
	rng      *rand.Rand
	events   simEvents
	waiting  []int // arrived, not booked, in arrival order
	// decisions counts the policy's choices, decided those per Run;
	// bookedBusy those that booked a Run to start now on a node whose
	// cards were all held.
	decisions, bookedBusy int
	decided               []int
	// ver is the fleet's version: it moves on with every booking, start,
	// end and arrival of bytes; lastVer is each Run's at its last
	// decision (-1: none yet), shapes each Run's queue.Shape.
	ver     int
	lastVer []int
	// kept are the card-seconds free cards sat idle, counted on by Runs
	// fetching their bytes on their node, up to keptAt.
	kept, keptAt float64
	shapes       []queue.Shape
	arrivals     simTimes
}

func newSimulator(t *simTrace, policy simPolicy, cfg placement.Config) *simulator {
	cat, runs := t.expand()
	s := &simulator{trace: t, cat: cat, runs: runs, state: make([]simRunState, len(runs)), cfg: cfg, policy: policy,
		rng: rand.New(rand.NewPCG(t.Seed, 0x5eed)), nodePos: map[string]int{}}
	s.decided, s.lastVer, s.shapes = make([]int, len(runs)), make([]int, len(runs)), make([]queue.Shape, len(runs))
	for i := range s.state {
		s.state[i].node, s.lastVer[i] = -1, -1
	}
	for i := range t.Fleet.Nodes {
		n := &simNode{id: fmt.Sprintf("node-%03d", i), layers: map[int]*simContent{}, arts: map[int]*simContent{},
			images: map[int]*simHeld{}, artUse: map[int]*simHeld{}}
		var cards []schemas.GPUCard
		for j := range t.Fleet.GPUsPerNode {
			uuid := fmt.Sprintf("GPU-%03d-%d", i, j)
			n.cards, n.holder = append(n.cards, uuid), append(n.holder, -1)
			cards = append(cards, schemas.GPUCard{Index: j, UUID: uuid, Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30,
				Health: schemas.GPUHealthOK, CDIDevices: []string{"nvidia.com/gpu=" + strconv.Itoa(j)}})
		}
		s.nodePos[n.id] = len(s.nodes)
		s.nodes = append(s.nodes, n)
		s.accel = append(s.accel, schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverCapability: "12.4",
			Devices: []schemas.AcceleratorDevice{{Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, Count: int64(t.Fleet.GPUsPerNode)}}, Cards: cards})
	}
	for _, im := range cat.images {
		l := schemas.ImageLocality{ManifestDigest: im.digest, State: schemas.LocalityHot, ContentPresent: true,
			Platform: schemas.Platform{OS: "linux", Architecture: "amd64"}}
		for _, id := range im.layers {
			l.LayerDigests = append(l.LayerDigests, cat.layerID[id])
			l.LayerSizes = append(l.LayerSizes, cat.layerBytes[id])
		}
		s.locality = append(s.locality, l)
	}
	for i, r := range runs {
		heap.Push(&s.events, simEvent{at: r.arrival, seq: i, run: i, arrive: true})
		s.shapes[i] = queue.ShapeOf(s.request(i).Run)
	}
	return s
}

func (s *simulator) clock(sec float64) time.Time {
	return simEpoch().Add(time.Duration(sec * float64(time.Second)))
}

// run simulates until every Run has ended, or ctx is done.
func (s *simulator) run(ctx context.Context) error {
	seq := len(s.runs)
	for s.events.Len() > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		now := s.events[0].at
		s.keep(now)
		for s.events.Len() > 0 && s.events[0].at == now {
			e := heap.Pop(&s.events).(simEvent)
			switch {
			case e.arrive:
				s.waiting = append(s.waiting, e.run)
			case e.ready:
				// Its bytes are there: the pass may start it.
			default:
				s.end(e.run, now)
			}
		}
		started, ready := s.pass(now)
		for _, run := range ready {
			seq++
			heap.Push(&s.events, simEvent{at: s.state[run].readyAt, seq: seq, run: run, ready: true})
		}
		for _, started := range started {
			seq++
			st := s.state[started]
			heap.Push(&s.events, simEvent{at: st.runningAt + s.runs[started].duration, seq: seq, run: started})
		}
	}
	if len(s.waiting) > 0 {
		return fmt.Errorf("%s on %s: %d Runs never placed", s.policy.name(), s.trace.Name, len(s.waiting))
	}
	return nil
}

func (s *simulator) end(run int, now float64) {
	st := &s.state[run]
	n := s.nodes[st.node]
	n.release(run)
	s.ver++
	s.unpin(n, run, now)
	st.done = true
	for i, r := range n.running {
		if r == run {
			n.running = append(n.running[:i], n.running[i+1:]...)
			break
		}
	}
}

// pass starts the Runs queued on nodes that now have their bytes and
// their cards free, then offers waiting Runs, oldest first, to the policy
// under the re-decision rule (decide). It returns the Runs given cards,
// and those booked to wait in a queue for bytes still on their way.
func (s *simulator) pass(now float64) (started, fetching []int) {
	started = s.startQueued(now, nil)
	s.factsChanged(now)
	var fleet *placement.Fleet
	skip := map[queue.Shape]bool{}
	var refused []int
	left := s.waiting[:0]
	for _, run := range s.waiting {
		if !s.due(run, skip) {
			if skip[s.shapes[run]] {
				refused = append(refused, run) // its shape's answer stands for it
			}
			left = append(left, run)
			continue
		}
		if fleet == nil {
			fleet = s.snapshot(now)
		}
		req := s.request(run)
		s.decisions++
		s.decided[run]++
		s.lastVer[run] = s.ver
		c := s.policy.choose(s, fleet, run, req, now)
		if !c.ok {
			// No eligible node: none of its shape would find one now.
			skip[s.shapes[run]] = true
			left = append(left, run)
			refused = append(refused, run)
			continue
		}
		if s.book(run, c, req, fleet, now) {
			started = append(started, run)
		} else if s.state[run].readyAt > now {
			fetching = append(fetching, run)
		}
	}
	s.waiting = left
	for _, run := range refused {
		// Bookings later in this pass only took capacity: they give a
		// Run that found no node (itself or by its shape) no reason to be
		// asked again.
		s.lastVer[run] = s.ver
	}
	// A Run queued behind one that just started may fit too.
	return s.startQueued(now, started), fetching
}

// due is the re-decision rule, as the scheduler's pass applies it: a
// waiting Run is decided again only when the fleet (bookings, cards,
// facts) changed since its last decision, and not once a Run of its shape
// found no node at all in this pass.
func (s *simulator) due(run int, skip map[queue.Shape]bool) bool {
	return s.lastVer[run] != s.ver && !skip[s.shapes[run]]
}

// book carries out choice c for run and reports whether it got its cards
// now.
func (s *simulator) book(run int, c simChoice, req placement.Request, fleet *placement.Fleet, now float64) bool {
	n := s.nodes[c.node]
	busy := c.queued
	if !busy && !c.fetchFirst && (s.readyQueued(n, now) > 0 || n.freeCards() < s.runs[run].gpus) {
		// Booked to start now on a node without the cards: no Run
		// can start so; it waits there, and the result counts it.
		s.bookedBusy++
		busy = true
	}
	queued := busy || c.fetchFirst
	s.ver++
	st := &s.state[run]
	st.node, st.queued, st.fetchFirst = c.node, busy, c.fetchFirst
	st.readyAt, st.pulled, st.fetch = s.fetch(n, run, now)
	st.expectReady = max(now, c.expectReady)
	heap.Push(&s.arrivals, st.readyAt)
	b := placement.Booking{RunID: req.RunID, Resources: req.Run.Resources, Want: req.Run.GPU}
	if queued {
		n.queued = append(n.queued, run)
	} else {
		s.start(n, run, now)
		b.GPUs = st.cards
	}
	b.ExpectedEnd = s.expectedEnd(run, now)
	fleet.Book(n.id, b, queued)
	return !queued
}

// factsChanged moves the fleet's version on when bytes finished arriving
// on some node since the last pass: its facts now list them.
func (s *simulator) factsChanged(now float64) {
	changed := false
	for s.arrivals.Len() > 0 && s.arrivals[0] <= now {
		heap.Pop(&s.arrivals)
		changed = true
	}
	if changed {
		s.ver++
	}
}

// startQueued gives their cards to the Runs at the head of node queues
// that now fit, appending them to started. A queued Run whose bytes are
// still on their way is passed over: it claims cards once they are there,
// and among those whose bytes are there the first to have them goes first
// (the scheduler's snapshot orders a node's queue by phase time, which a
// Run's prepared report moves).
func (s *simulator) startQueued(now float64, started []int) []int {
	for _, n := range s.nodes {
		for {
			head := s.readyHead(n, now)
			if head < 0 || n.freeCards()-s.fetchingAhead(n, head, now) < s.runs[n.queued[head]].gpus {
				break
			}
			run := n.queued[head]
			n.queued = append(n.queued[:head], n.queued[head+1:]...)
			s.ver++
			s.start(n, run, now)
			started = append(started, run)
		}
	}
	return started
}

// readyHead is the position in n's queue of the Run whose bytes arrived
// first (-1: none has them yet).
func (s *simulator) readyHead(n *simNode, now float64) int {
	head := -1
	for i, run := range n.queued {
		if at := s.state[run].readyAt; at <= now && (head < 0 || at < s.state[n.queued[head]].readyAt) {
			head = i
		}
	}
	return head
}

// fetchingAhead sums the cards the Runs booked on n before the one at
// position i, still fetching their bytes, will claim.
func (s *simulator) fetchingAhead(n *simNode, i int, now float64) int {
	cards := 0
	for _, run := range n.queued[:i] {
		if s.state[run].readyAt > now {
			cards += s.runs[run].gpus
		}
	}
	return cards
}

// keep adds, up to now, the card-seconds each node's free cards were
// kept for the Runs fetching their bytes there (no more than those Runs
// will claim): idle cards waiting on pulls as much as cards held are. The
// fleet is unchanged between events, and a Run's bytes arriving is one.
func (s *simulator) keep(now float64) {
	if now > s.keptAt {
		for _, n := range s.nodes {
			if fetching := s.fetchingAhead(n, len(n.queued), s.keptAt); fetching > 0 {
				s.kept += (now - s.keptAt) * float64(min(n.freeCards(), fetching))
			}
		}
	}
	s.keptAt = now
}

// readyQueued counts the Runs queued on n whose bytes are there.
func (s *simulator) readyQueued(n *simNode, now float64) int {
	count := 0
	for _, run := range n.queued {
		if s.state[run].readyAt <= now {
			count++
		}
	}
	return count
}

// start gives run its cards on n at now.
func (s *simulator) start(n *simNode, run int, now float64) {
	st := &s.state[run]
	st.cards = n.take(run, s.runs[run].gpus)
	st.cardsAt = now
	st.runningAt = max(now, st.readyAt)
	n.running = append(n.running, run)
}

// simEvent is a Run arriving, its bytes arriving on its node (ready), or
// its end; seq keeps the order stable.
type simEvent struct {
	at            float64
	seq           int
	run           int
	arrive, ready bool
}

type simEvents []simEvent

func (h simEvents) Len() int { return len(h) }
func (h simEvents) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h simEvents) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simEvents) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *simEvents) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// simTimes is a min-heap of times bytes finish arriving on a node.
type simTimes []float64

func (h simTimes) Len() int           { return len(h) }
func (h simTimes) Less(i, j int) bool { return h[i] < h[j] }
func (h simTimes) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *simTimes) Push(x any)        { *h = append(*h, x.(float64)) }
func (h *simTimes) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}
