package e2e

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"math"
	"net"
	"slices"
	"sync"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// loopCapture records the TCP payloads crossing the loopback interface to
// or from some ports, as any process in the host's network namespace with
// CAP_NET_RAW can: an AF_PACKET socket on lo, opened by the test itself.
type loopCapture struct {
	t     *testing.T
	fd    int
	ports []uint16
	done  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	flows map[[2]uint16]*tcpFlow // by source and destination port
}

// tcpFlow is one direction of one connection: its segments by sequence
// number, for reassembly.
type tcpFlow struct {
	base uint32 // the first sequence number seen
	segs map[int64][]byte
}

// startLoopCapture starts capturing on lo the TCP traffic of ports (either
// end); the capture stops when t ends or at stop.
func startLoopCapture(t *testing.T, ports ...uint16) *loopCapture {
	t.Helper()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	proto := int(htons(unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		t.Fatalf("packet socket on lo (needs root): %v", err)
	}
	c := &loopCapture{t: t, fd: fd, ports: ports, done: make(chan struct{}), flows: map[[2]uint16]*tcpFlow{}}
	if err := c.setup(lo.Index, proto); err != nil {
		_ = unix.Close(fd)
		t.Fatal(err)
	}
	c.wg.Add(1)
	go c.read()
	t.Cleanup(c.stop)
	return c
}

// setup filters the socket to the ports in the kernel (the machine's other
// loopback traffic never reaches it), binds it to lo, gives it a large
// buffer and a read timeout so the reader notices stop.
func (c *loopCapture) setup(ifindex, proto int) error {
	raw, err := bpf.Assemble(portFilter(c.ports))
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	if err := unix.SetsockoptSockFprog(c.fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
		return err
	}
	if err := unix.Bind(c.fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifindex}); err != nil {
		return err
	}
	if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20); err != nil {
		return err
	}
	return unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200_000})
}

// portFilter keeps IPv4 TCP packets (lo frames carry an Ethernet header)
// whose source or destination port is one of ports.
func portFilter(ports []uint16) []bpf.Instruction {
	k := len(ports)
	drop := 9 + 2*k // index of the drop instruction; keep follows it
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 12, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.ETH_P_IP, SkipTrue: uint8(drop - 2)},
		bpf.LoadAbsolute{Off: 23, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_TCP, SkipTrue: uint8(drop - 4)},
		bpf.LoadAbsolute{Off: 20, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: uint8(drop - 6)}, // a later fragment has no ports
		bpf.LoadMemShift{Off: 14},
		bpf.LoadIndirect{Off: 14, Size: 2},
	}
	for _, off := range []uint32{14, 16} {
		if off == 16 {
			prog = append(prog, bpf.LoadIndirect{Off: 16, Size: 2})
		}
		for _, p := range ports {
			prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(p), SkipTrue: uint8(drop - len(prog))})
		}
	}
	return append(prog, bpf.RetConstant{Val: 0}, bpf.RetConstant{Val: 1 << 18})
}

// read stores every captured segment until stop. Each frame on lo is seen
// leaving and arriving; only the arrival is kept.
func (c *loopCapture) read() {
	defer c.wg.Done()
	buf := make([]byte, 256<<10)
	for {
		select {
		case <-c.done:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			c.t.Errorf("capture: %v", err)
			return
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		c.add(buf[:n])
	}
}

// add files one Ethernet frame's TCP payload under its flow.
func (c *loopCapture) add(frame []byte) {
	if len(frame) < 14+20 {
		return
	}
	ip := frame[14:]
	ihl := int(ip[0]&0xf) * 4
	if total := int(binary.BigEndian.Uint16(ip[2:4])); total >= ihl && total <= len(ip) {
		ip = ip[:total]
	}
	if len(ip) < ihl+20 {
		return
	}
	tcp := ip[ihl:]
	off := int(tcp[12]>>4) * 4
	if off > len(tcp) || off == len(tcp) {
		return
	}
	key := [2]uint16{binary.BigEndian.Uint16(tcp[0:2]), binary.BigEndian.Uint16(tcp[2:4])}
	seq := binary.BigEndian.Uint32(tcp[4:8])
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.flows[key]
	if f == nil {
		f = &tcpFlow{base: seq, segs: map[int64][]byte{}}
		c.flows[key] = f
	}
	rel := int64(int32(seq - f.base))
	if _, dup := f.segs[rel]; !dup {
		f.segs[rel] = bytes.Clone(tcp[off:])
	}
}

// stop ends the capture and fails t if the kernel dropped any packet: a
// capture with holes proves nothing absent.
func (c *loopCapture) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	close(c.done)
	c.wg.Wait()
	st, err := unix.GetsockoptTpacketStats(c.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		c.t.Errorf("capture statistics: %v", err)
	} else if st.Drops > 0 {
		c.t.Errorf("capture dropped %d of %d packets", st.Drops, st.Packets)
	}
	_ = unix.Close(c.fd)
}

// streams are the reassembled byte streams of the flows touching port,
// one per direction of each connection.
func (c *loopCapture) streams(port uint16) [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [][]byte
	for key, f := range c.flows {
		if key[0] != port && key[1] != port {
			continue
		}
		var stream []byte
		end := int64(math.MinInt64)
		for _, rel := range slices.Sorted(maps.Keys(f.segs)) {
			seg := f.segs[rel]
			if skip := end - rel; skip > 0 { // a retransmission overlapping what is held
				if skip >= int64(len(seg)) {
					continue
				}
				seg = seg[skip:]
			}
			stream = append(stream, seg...)
			end = max(end, rel+int64(len(f.segs[rel])))
		}
		out = append(out, stream)
	}
	return out
}

// htons is v in network byte order, as packet sockets take protocols.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
