package natstest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"sync"
	"time"
)

// proxy forwards TCP connections to one node of a Cluster. Every client and
// route connection of the cluster goes through one, so that Kill can cut a
// node off at once, as a SIGKILL or a pulled cable would, before the node
// gets to say goodbye (step down its leaders, tell its pull consumers).
// Its address stays the same across restarts of the node behind it.
type proxy struct {
	ln    net.Listener
	route bool // route connections: learn the dialing server from CONNECT

	mu     sync.Mutex
	target string        // the node's real address; "" while down
	ready  chan struct{} // closed once the first target is set
	conns  map[*proxyConn]struct{}
	closed bool
	// deadIDs are the server IDs of killed nodes, whose route connections
	// to the node behind this proxy are refused.
	deadIDs map[string]bool
}

type proxyConn struct {
	in, out net.Conn
	from    string // for a route: the ID of the server that dialed
}

func (pc *proxyConn) close() {
	pc.in.Close()
	pc.out.Close()
}

func newProxy(route bool) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, route: route, ready: make(chan struct{}), conns: map[*proxyConn]struct{}{}, deadIDs: map[string]bool{}}
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// setTarget points the proxy at a node that is up.
func (p *proxy) setTarget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = addr
	select {
	case <-p.ready:
	default:
		close(p.ready)
	}
}

// down refuses new connections and cuts every open one.
func (p *proxy) down() {
	p.mu.Lock()
	p.target = ""
	conns := p.conns
	p.conns = map[*proxyConn]struct{}{}
	p.mu.Unlock()
	for pc := range conns {
		pc.close()
	}
}

// cutFrom cuts the route connections server id dialed, and refuses its
// next ones.
func (p *proxy) cutFrom(id string) {
	p.mu.Lock()
	p.deadIDs[id] = true
	var cut []*proxyConn
	for pc := range p.conns {
		if pc.from == id {
			cut = append(cut, pc)
			delete(p.conns, pc)
		}
	}
	p.mu.Unlock()
	for _, pc := range cut {
		pc.close()
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.down()
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *proxy) handle(in net.Conn) {
	// While the cluster starts, nodes dial each other before every node
	// is up: hold them rather than refuse, which would cost a reconnect
	// delay.
	select {
	case <-p.ready:
	case <-time.After(waitLimit):
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	if target == "" {
		in.Close()
		return
	}
	out, err := net.Dial("tcp", target)
	if err != nil {
		in.Close()
		return
	}
	pc := &proxyConn{in: in, out: out}
	r := bufio.NewReader(in)
	if p.route {
		// The node behind us sends INFO first; the dialer answers with
		// CONNECT, which names it.
		go func() { _, _ = io.Copy(in, out); pc.close() }()
		line, err := r.ReadBytes('\n')
		if err != nil {
			pc.close()
			return
		}
		pc.from = connectID(line)
		if !p.add(pc) {
			return
		}
		if _, err := out.Write(line); err != nil {
			pc.close()
			return
		}
	} else {
		go func() { _, _ = io.Copy(in, out); pc.close() }()
		if !p.add(pc) {
			return
		}
	}
	_, _ = io.Copy(out, r)
	pc.close()
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

// add registers pc so that down and cutFrom can cut it, or closes it if
// the node is down or the dialer dead.
func (p *proxy) add(pc *proxyConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.target == "" || p.deadIDs[pc.from] {
		pc.close()
		return false
	}
	p.conns[pc] = struct{}{}
	return true
}

// connectID returns the server ID in a route's CONNECT line, or "".
func connectID(line []byte) string {
	rest, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("CONNECT "))
	if !ok {
		return ""
	}
	var c struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(rest, &c) != nil {
		return ""
	}
	return c.Name
}
