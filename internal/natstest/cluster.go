package natstest

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ClusterSize is the number of nodes RunCluster starts: the smallest cluster
// that keeps a quorum (and so an R3 stream) with one node down.
const ClusterSize = 3

// account is the account clients land in when the servers configure none.
const account = server.DEFAULT_GLOBAL_ACCOUNT

// waitLimit bounds every wait of the cluster helpers. It is not a timed
// assertion: elections take seconds (the servers' election timeout is 4–9 s
// and cannot be shortened from outside their package); it only stops a
// broken cluster from hanging a test.
const waitLimit = 60 * time.Second

// Cluster is a JetStream cluster of ClusterSize nodes in this process, named
// n1, n2 and n3, each with its own store directory, so that a node can be
// shut down and restarted with its data and rejoin. Its methods may be called
// from any goroutine.
type Cluster struct {
	t    testing.TB
	name string

	mu      sync.Mutex
	servers []*server.Server // nil while a node is down
	opts    []*server.Options
	// Every connection to node i goes through clients[i] or routes[i]:
	// their addresses are the node's for good, whatever ports it gets when
	// it restarts, and Kill cuts them.
	clients, routes []*proxy
}

// RunCluster starts a 3-node JetStream cluster on loopback ports and returns
// once the nodes are routed to each other and the JetStream meta group has a
// leader that knows all three peers. Every node is shut down on t.Cleanup.
func RunCluster(t testing.TB) *Cluster {
	t.Helper()
	c := &Cluster{t: t, name: "ctxpipe-test"}
	// The store directories are made before the shutdown is registered:
	// cleanups run last-registered first, and a directory removed while its
	// node still writes fails the test ("directory not empty").
	dirs := make([]string, ClusterSize)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	t.Cleanup(c.shutdownAll)
	for range ClusterSize {
		cp, err := newProxy(false)
		if err != nil {
			t.Fatalf("natstest: proxy: %v", err)
		}
		rp, err := newProxy(true)
		if err != nil {
			cp.close()
			t.Fatalf("natstest: proxy: %v", err)
		}
		c.clients = append(c.clients, cp)
		c.routes = append(c.routes, rp)
	}
	for i := range ClusterSize {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       -1,
			// Clients and the other nodes learn the proxies' addresses.
			ClientAdvertise: c.clients[i].addr(),
			JetStream:       true,
			StoreDir:        dirs[i],
			MaxPayload:      MaxPayload,
			NoLog:           true,
			NoSigs:          true,
			Cluster: server.ClusterOpts{
				Name:      c.name,
				Host:      "127.0.0.1",
				Port:      -1,
				Advertise: c.routes[i].addr(),
			},
		}
		for j, r := range c.routes {
			if j != i {
				o.Routes = append(o.Routes, &url.URL{Scheme: "nats-route", Host: r.addr()})
			}
		}
		c.opts = append(c.opts, o)
		c.servers = append(c.servers, nil)
	}
	// Each node starts while the others' proxies hold its route
	// connections until their nodes are up.
	for i := range ClusterSize {
		if err := c.startNode(i); err != nil {
			t.Fatalf("natstest: start %s: %v", c.opts[i].ServerName, err)
		}
	}
	c.waitMeta(ClusterSize)
	return c
}

func startServer(o *server.Options) (*server.Server, error) {
	s, err := server.NewServer(o)
	if err != nil {
		return nil, err
	}
	go s.Start()
	if !s.ReadyForConnections(waitLimit) {
		s.Shutdown()
		return nil, fmt.Errorf("not ready for connections after %v", waitLimit)
	}
	return s, nil
}

// URLs returns the client URL of every node, down or not, in node order.
func (c *Cluster) URLs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	urls := make([]string, len(c.clients))
	for i, p := range c.clients {
		urls[i] = "nats://" + p.addr()
	}
	return urls
}

// URL returns every node's client URL comma-separated, as nats.Connect (and
// --nats-url) takes them, so a client fails over between the nodes.
func (c *Cluster) URL() string { return strings.Join(c.URLs(), ",") }

// Name returns the server name of node i (0-based): "n1", "n2" or "n3".
func (c *Cluster) Name(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opts[i].ServerName
}

// Server returns node i, or nil while it is shut down.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// Index returns the index of the node with the given server name, or -1.
func (c *Cluster) Index(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, o := range c.opts {
		if o.ServerName == name {
			return i
		}
	}
	return -1
}

// Shutdown stops node i gracefully, as a SIGTERM would, and waits until it
// is down: it hands its leaderships over (in milliseconds) and tells the
// pull requests it holds that it is going. Its store directory is kept for
// Restart. Shutting down a node that is down does nothing. Kill is the
// harsher test.
func (c *Cluster) Shutdown(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
	c.clients[i].down()
	c.routes[i].down()
}

// Kill stops node i as a SIGKILL would: every connection to and from it is
// cut first, so it cannot hand its leaderships over or tell its clients'
// pull requests that it is going; the other nodes find out by timeouts,
// and elect new leaders after their election timeout (4–9 s). Its store
// directory is kept for Restart. Killing a node that is down does nothing.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s == nil {
		return
	}
	c.clients[i].down()
	c.routes[i].down()
	for j, r := range c.routes {
		if j != i {
			r.cutFrom(s.ID())
		}
	}
	s.Shutdown()
	s.WaitForShutdown()
}

// KillByName kills the node with the given server name and returns its
// index.
func (c *Cluster) KillByName(name string) int {
	c.t.Helper()
	i := c.mustIndex(name)
	c.Kill(i)
	return i
}

// ShutdownByName stops the node with the given server name (as a stream or
// consumer leader is reported) and returns its index.
func (c *Cluster) ShutdownByName(name string) int {
	c.t.Helper()
	i := c.mustIndex(name)
	c.Shutdown(i)
	return i
}

// mustIndex is Index, failing the test when no node has the name.
func (c *Cluster) mustIndex(name string) int {
	c.t.Helper()
	i := c.Index(name)
	if i < 0 {
		c.t.Fatalf("natstest: no node named %q", name)
	}
	return i
}

// Restart starts node i again with the same store directory, behind the
// same addresses, and waits until it has rejoined: it is current with a meta
// leader. Restarting a node that is up does nothing.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if c.Server(i) != nil {
		return
	}
	if err := c.startNode(i); err != nil {
		c.t.Fatalf("natstest: restart %s: %v", c.Name(i), err)
	}
	s := c.Server(i)
	c.wait(s.Name()+" current with the meta leader", func() string {
		if c.MetaLeader() != "" && s.JetStreamIsCurrent() {
			return s.Name()
		}
		return ""
	})
}

// startNode starts node i on ports of the kernel's choice and points its
// proxies at them.
func (c *Cluster) startNode(i int) error {
	c.mu.Lock()
	// The server keeps and adjusts the options it is given: hand it a copy.
	o := c.opts[i].Clone()
	c.mu.Unlock()
	s, err := startServer(o)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.servers[i] = s
	c.mu.Unlock()
	c.clients[i].setTarget(s.Addr().String())
	c.routes[i].setTarget(s.ClusterAddr().String())
	return nil
}

// MetaLeader returns the name of the node leading the JetStream meta group,
// or "" when there is none.
func (c *Cluster) MetaLeader() string {
	return c.find(func(s *server.Server) bool { return s.JetStreamIsLeader() })
}

// StreamLeader returns the name of the node leading the stream (in the
// default account), or "" when there is none. It asks the running servers
// themselves, so it never answers with a node that is down, as a cached
// StreamInfo can.
func (c *Cluster) StreamLeader(stream string) string {
	return c.find(func(s *server.Server) bool { return s.JetStreamIsStreamLeader(account, stream) })
}

// ConsumerLeader returns the name of the node leading the stream's consumer,
// or "" when there is none.
func (c *Cluster) ConsumerLeader(stream, consumer string) string {
	return c.find(func(s *server.Server) bool { return s.JetStreamIsConsumerLeader(account, stream, consumer) })
}

// WaitStreamLeader waits until the stream has a leader and returns its name.
func (c *Cluster) WaitStreamLeader(stream string) string {
	c.t.Helper()
	return c.wait("leader of stream "+stream, func() string { return c.StreamLeader(stream) })
}

// WaitConsumerLeader waits until the consumer has a leader and returns its
// name.
func (c *Cluster) WaitConsumerLeader(stream, consumer string) string {
	c.t.Helper()
	return c.wait("leader of consumer "+stream+"/"+consumer, func() string { return c.ConsumerLeader(stream, consumer) })
}

func (c *Cluster) find(is func(*server.Server) bool) string {
	c.mu.Lock()
	servers := append([]*server.Server(nil), c.servers...)
	c.mu.Unlock()
	for _, s := range servers {
		if s != nil && s.Running() && is(s) {
			return s.Name()
		}
	}
	return ""
}

func (c *Cluster) wait(what string, get func() string) string {
	c.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		if name := get(); name != "" {
			return name
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("natstest: no %s after %v", what, waitLimit)
	return ""
}

// WaitPeers waits until the meta leader counts every node as an online
// peer and every node is current with it. A node can be taken for offline
// for a moment on a loaded machine, and a replicated stream created or
// raised meanwhile is refused ("no suitable peers for placement").
func (c *Cluster) WaitPeers() {
	c.t.Helper()
	c.waitMeta(ClusterSize)
}

// waitMeta waits until a meta leader counts peers nodes as its peers and
// every running node is current with it: a JetStream API request sent
// before that can be lost, and wait for its full timeout.
func (c *Cluster) waitMeta(peers int) {
	c.t.Helper()
	c.wait(fmt.Sprintf("meta leader with %d current peers", peers), func() string {
		c.mu.Lock()
		servers := append([]*server.Server(nil), c.servers...)
		c.mu.Unlock()
		leader := ""
		for _, s := range servers {
			if s == nil {
				continue
			}
			if !s.JetStreamIsCurrent() {
				return ""
			}
			if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) >= peers {
				leader = s.Name()
			}
		}
		return leader
	})
}

func (c *Cluster) shutdownAll() {
	for i := range c.servers {
		c.Shutdown(i)
	}
	for i := range c.clients {
		c.clients[i].close()
		c.routes[i].close()
	}
}
