package gossip

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
)

// Roles of members.
const (
	RoleServer = "server"
	RoleAgent  = "agent"
)

// Meta is what a member tells the others about itself. It must stay under memberlist's 512-byte limit.
type Meta struct {
	Role            string `json:"r"`
	RaftAddr        string `json:"ra,omitempty"`
	APIAddr         string `json:"aa,omitempty"`
	BootstrapExpect int    `json:"be,omitempty"`
	// BootID is drawn at each process start, so the pool can tell a restarted member from the same run.
	BootID string   `json:"b,omitempty"`
	Nodes  []string `json:"n,omitempty"` // nodes an agent hosts
	// NodePrefix and NodeCount name many hosted nodes in few bytes: <prefix>-0 to <prefix>-<count-1>. A
	// simulated agent hosting thousands of nodes could not list them within the metadata limit.
	NodePrefix string `json:"np,omitempty"`
	NodeCount  int    `json:"nc,omitempty"`
	// Leaving is set just before a graceful leave, so the others can tell "left" from "failed": memberlist
	// reports both as a leave.
	Leaving bool `json:"l,omitempty"`
	// KeyringHash is Keyring.Hash of the member's gossip keyring, which the pool fills in itself: it tells
	// when every member has applied a new keyring. Empty without encryption.
	KeyringHash string `json:"kh,omitempty"`
	// Version is the member's Skiff version (internal/version), shown by `skiff operator members`.
	Version string `json:"v,omitempty"`
}

// HostedNodes are the names of the nodes the member hosts.
func (m Meta) HostedNodes() []string {
	out := append([]string(nil), m.Nodes...)
	for i := 0; i < m.NodeCount; i++ {
		out = append(out, m.NodePrefix+"-"+strconv.Itoa(i))
	}
	return out
}

// Status is a member's liveness as gossip sees it. (memberlist keeps suspicion to itself: a suspect member
// stays alive here until it is declared dead.)
type Status string

const (
	StatusAlive Status = "alive"
	StatusDead  Status = "dead"
	StatusLeft  Status = "left"
)

// Member is one entry of the pool's member table.
type Member struct {
	Name   string
	Addr   string // host:port of the gossip listener
	Status Status
	Meta   Meta
}

// EventType says what changed.
type EventType string

const (
	EventJoin   EventType = "join"
	EventLeave  EventType = "leave" // left gracefully or declared dead; Member.Status tells which
	EventUpdate EventType = "update"
)

// Event is one member state change.
type Event struct {
	Type   EventType
	Member Member
}

// Config configures a pool member.
type Config struct {
	Name          string
	BindAddr      string
	BindPort      int
	AdvertiseAddr string // defaults to BindAddr
	Meta          Meta
	RetryJoin     []string // host:port of members to join
	RetryInterval time.Duration
	// ReconnectInterval is how often a member tries to reach one member it saw fail (default 10 s).
	ReconnectInterval time.Duration
	// RetryMax is how many join attempts to make before giving up (JoinFailed closes); 0 means forever.
	RetryMax int
	// PeersFile is where the member keeps the gossip addresses of the members it has seen. After a restart it
	// joins through them as well as RetryJoin, whose members may be gone by then (a restarted agent whose
	// only retry_join server died would otherwise never rejoin). Empty keeps nothing.
	PeersFile string
	// Encryption. The member starts with the keyring in KeyringFile when that file exists, else with
	// EncryptKey, else with DefaultKey; with none of them gossip is not encrypted. KeyringFile is rewritten
	// whenever the keyring changes (SetKeyring), so that a restart keeps rotated keys.
	EncryptKey  string // base64 AES key (16, 24 or 32 bytes), as the operator configured it
	DefaultKey  []byte // the key when the operator configured none: KeyFromSecret of the cluster token
	KeyringFile string // empty keeps no file
	// Local selects memberlist's loopback timings (fast failure detection), for tests and dev mode.
	Local  bool
	Logger hclog.Logger
}

// Pool is this process's membership in the gossip pool.
type Pool struct {
	cfg    Config
	logger hclog.Logger
	ml     *memberlist.Memberlist
	mlConf *memberlist.Config

	mu         sync.Mutex
	meta       Meta
	members    map[string]Member
	subs       map[chan Event]struct{}
	peersDirty bool // the member table changed since PeersFile was written
	// leaveIntents holds, by member name, the BootID of the run that announced a graceful leave directly
	// to this member (see Leave): it tells "left" from "failed" even when memberlist's leave overtook the
	// Leaving metadata.
	leaveIntents map[string]string
	// keyringHash is published in the metadata (Meta.KeyringHash); keyMu serializes keyring changes.
	keyringHash string
	keyMu       sync.Mutex

	joinAddrs []string // RetryJoin, then the remembered peers

	joined     chan struct{}
	joinOnce   sync.Once
	joinFailed chan struct{}
	stop       chan struct{}
	stopOnce   sync.Once
	wg         sync.WaitGroup
}

// New creates the member and starts joining RetryJoin in the background.
func New(cfg Config) (*Pool, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = 2 * time.Second
	}
	if cfg.ReconnectInterval <= 0 {
		cfg.ReconnectInterval = 10 * time.Second
	}
	p := &Pool{
		cfg: cfg, logger: cfg.Logger.Named("gossip"), meta: cfg.Meta,
		members: map[string]Member{}, subs: map[chan Event]struct{}{}, leaveIntents: map[string]string{},
		joined: make(chan struct{}), joinFailed: make(chan struct{}), stop: make(chan struct{}),
	}
	mc := memberlist.DefaultLANConfig()
	if cfg.Local {
		mc = memberlist.DefaultLocalConfig()
	}
	// Failure detection within 3 s, measured by BenchmarkNodeDetection and BenchmarkScale. A failed member
	// is first found by a probe (each member probes one other per ProbeInterval; no ack within ProbeTimeout,
	// then indirect probes through others until the interval ends), then suspected for SuspicionMult ×
	// max(1, log10 N) probe intervals, its window to refute: 1 s up to 10 members, 2 s at 100. memberlist's
	// LAN defaults (1 s and 500 ms, multiplier 4, and up to 6× that while waiting for independent
	// confirmations) put a kill -9's detection at 6-8 s; at SuspicionMult 2 no confirmation is awaited
	// (SuspicionMult - 2 = 0). A 300 ms probe timeout is hundreds of round trips on a LAN, and memberlist
	// stretches its timeouts on a member that finds itself slow (Lifeguard's awareness). The price is a
	// shorter refute window for a member starved of CPU, and twice the probe traffic of the defaults; the
	// leader confirms a failure with its own probe before it acts on it (Reachable).
	mc.SuspicionMult = 2
	mc.ProbeInterval = 500 * time.Millisecond
	mc.ProbeTimeout = 300 * time.Millisecond
	mc.Name = cfg.Name
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.AdvertisePort = cfg.BindPort
	mc.Delegate = (*delegate)(p)
	mc.Events = (*events)(p)
	mc.Logger = p.logger.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	if ring, ok, err := p.initialKeyring(); err != nil {
		return nil, err
	} else if ok {
		if mc.Keyring, err = memberlistKeyring(ring); err != nil {
			return nil, fmt.Errorf("gossip encryption key: %w", err)
		}
		p.keyringHash = ring.Hash()
	}
	if _, err := json.Marshal(cfg.Meta); err != nil {
		return nil, err
	}
	p.mlConf = mc
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("starting gossip on %s: %w", net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.BindPort)), err)
	}
	p.ml = ml
	if cfg.PeersFile != "" {
		p.wg.Add(1)
		go p.keepPeers()
	}
	// The join goroutines are not waited for at Shutdown: a join to an unreachable address blocks for
	// memberlist's TCP timeout, and they check p.stop between attempts.
	if len(cfg.RetryJoin) == 0 {
		p.joinOnce.Do(func() { close(p.joined) })
	} else {
		remembered := readPeers(cfg.PeersFile)
		rand.Shuffle(len(remembered), func(i, j int) { remembered[i], remembered[j] = remembered[j], remembered[i] })
		p.joinAddrs = joinAddresses(cfg.RetryJoin, remembered, ml.LocalNode().Address())
		go p.retryJoin()
	}
	go p.reconnect()
	return p, nil
}

// rememberedJoins is how many remembered peers a restarted member adds to its join list: memberlist's
// Join exchanges the full state with every address it is given, so a few reachable ones are enough.
const rememberedJoins = 3

// joinAddresses is retryJoin followed by up to rememberedJoins remembered peers it lacks, without this
// member's own address.
func joinAddresses(retryJoin, remembered []string, self string) []string {
	seen := map[string]bool{self: true}
	var out []string
	added := 0
	for i, addr := range append(append([]string(nil), retryJoin...), remembered...) {
		if seen[addr] || (i >= len(retryJoin) && added == rememberedJoins) {
			continue
		}
		seen[addr] = true
		out = append(out, addr)
		if i >= len(retryJoin) {
			added++
		}
	}
	return out
}

// reconnect heals partitions, as Serf does. memberlist stops gossiping to a failed member after
// GossipToTheDeadTime (30 s) and forgets it, so after a longer partition neither side would ever contact the
// other again; each round, one failed (not departed) member picked at random is joined anew.
func (p *Pool) reconnect() {
	for {
		select {
		case <-p.stop:
			return
		case <-time.After(p.cfg.ReconnectInterval):
		}
		var failed []string
		for _, m := range p.Members() {
			if m.Status == StatusDead && m.Name != p.cfg.Name {
				failed = append(failed, m.Addr)
			}
		}
		if len(failed) == 0 {
			continue
		}
		addr := failed[rand.IntN(len(failed))]
		if n, err := p.ml.Join([]string{addr}); n > 0 {
			p.logger.Info("reconnected to a failed member", "address", addr)
		} else {
			p.logger.Debug("failed member still unreachable", "address", addr, "error", err)
		}
	}
}

// readPeers is the address list PeersFile holds; none when it is missing or unreadable.
func readPeers(path string) []string {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var addrs []string
	if json.Unmarshal(data, &addrs) != nil {
		return nil
	}
	return addrs
}

// peersWriteInterval bounds how often PeersFile is rewritten: a burst of joins costs one write.
const peersWriteInterval = 2 * time.Second

// keepPeers writes the alive members' addresses to PeersFile whenever the member table changed.
func (p *Pool) keepPeers() {
	defer p.wg.Done()
	tick := time.NewTicker(peersWriteInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		dirty := p.peersDirty
		p.peersDirty = false
		p.mu.Unlock()
		if !dirty {
			continue
		}
		if err := p.writePeers(); err != nil {
			p.logger.Warn("remembering the gossip peers", "file", p.cfg.PeersFile, "error", err)
			p.mu.Lock()
			p.peersDirty = true // try again next time
			p.mu.Unlock()
		}
	}
}

// writePeers writes the alive members' addresses to PeersFile, whole or not at all.
func (p *Pool) writePeers() error {
	var addrs []string
	for _, m := range p.Alive("") {
		if m.Name != p.cfg.Name {
			addrs = append(addrs, m.Addr)
		}
	}
	if len(addrs) == 0 {
		return nil // alone: keep what was known, it is the way back
	}
	data, err := json.Marshal(addrs)
	if err != nil {
		return err
	}
	tmp := p.cfg.PeersFile + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p.cfg.PeersFile)
}

// retryJoin keeps trying the join addresses until at least one other member answers. Servers started in any
// order find each other this way.
func (p *Pool) retryJoin() {
	for attempt := 1; ; attempt++ {
		n, err := p.ml.Join(p.joinAddrs)
		if n > 0 && p.ml.NumMembers() > 1 {
			p.logger.Info("joined gossip pool", "contacted", n, "members", p.ml.NumMembers())
			p.joinOnce.Do(func() { close(p.joined) })
			return
		}
		if p.cfg.RetryMax > 0 && attempt >= p.cfg.RetryMax {
			p.logger.Error("giving up joining the gossip pool", "addresses", p.joinAddrs, "attempts", attempt, "error", err)
			close(p.joinFailed)
			return
		}
		if attempt%30 == 5 && len(p.joinAddrs) > 0 {
			// Say it now and then: a member with another encryption key fails to join in silence otherwise.
			// (With no address but its own, a first server waits for the others to join it: nothing to say.)
			p.logger.Warn("not in the gossip pool yet: the members are unreachable, or use another encryption key; retrying",
				"addresses", p.joinAddrs, "attempts", attempt, "error", err)
		} else {
			p.logger.Debug("join attempt failed, retrying", "addresses", p.joinAddrs, "error", err)
		}
		select {
		case <-p.stop:
			return
		case <-time.After(p.cfg.RetryInterval):
		}
	}
}

// Joined is closed once the member has joined at least one other member (at once when there is nothing to
// join).
func (p *Pool) Joined() <-chan struct{} { return p.joined }

// SuspicionTimeout is how long memberlist suspects a member before declaring it dead, at the pool's
// current size (memberlist's own formula: SuspicionMult × max(1, log10(N)) × ProbeInterval).
func (p *Pool) SuspicionTimeout() time.Duration {
	scale := math.Max(1, math.Log10(math.Max(1, float64(p.ml.NumMembers()))))
	return time.Duration(float64(p.mlConf.SuspicionMult) * scale * float64(p.mlConf.ProbeInterval))
}

// Reachable says whether the member answers a direct ping now. It sends two pings at once, so that one lost
// datagram does not condemn a live member, and waits at most one probe timeout; a member whose process is
// gone on a machine that is up is known at once, by the TCP connection its gossip port refuses.
//
// It is how a failure in this member's view is confirmed before anything acts on it: after a partition
// heals, the member that was cut off still holds the others as failed until it reconnects (up to
// ReconnectInterval) or a member refutes.
func (p *Pool) Reachable(name string) bool {
	reachable, _ := p.probe(name)
	return reachable
}

// How a probe of Reachable was decided.
const (
	probeAnswered = "answered"  // a ping was answered
	probeRefused  = "refused"   // the gossip port refused a TCP connection: nothing listens there
	probeNoAnswer = "no answer" // neither ping was answered within the probe timeout
	probeUnknown  = "unknown"   // not a member, or no address to probe
)

// probe is Reachable, with how it was decided.
func (p *Pool) probe(name string) (bool, string) {
	m, ok := p.Member(name)
	if !ok {
		return false, probeUnknown
	}
	addr, err := net.ResolveUDPAddr("udp", m.Addr)
	if err != nil {
		return false, probeUnknown
	}
	pings := make(chan bool, 2)
	for range 2 {
		go func() {
			_, err := p.ml.Ping(name, addr)
			pings <- err == nil
		}()
	}
	// memberlist listens on TCP on the gossip port too. A refused connection is conclusive where a ping's
	// silence is not: without it, every failure took a whole probe timeout (300 ms) more to act on, in each
	// leader's pass that saw a member die. A connection that opens proves nothing (a paused process's kernel
	// still accepts one) and is closed at once; the pings decide.
	refused := make(chan struct{}, 1)
	go func() {
		conn, err := net.DialTimeout("tcp", m.Addr, p.mlConf.ProbeTimeout)
		if err == nil {
			conn.Close()
		} else if errors.Is(err, syscall.ECONNREFUSED) {
			refused <- struct{}{}
		}
	}()
	for range 2 {
		select {
		case ok := <-pings:
			if ok {
				return true, probeAnswered
			}
		case <-refused:
			return false, probeRefused
		}
	}
	return false, probeNoAnswer
}

// JoinFailed is closed when RetryMax join attempts all failed.
func (p *Pool) JoinFailed() <-chan struct{} { return p.joinFailed }

// Members returns the member table, dead and left members included, sorted by name.
func (p *Pool) Members() []Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Member, 0, len(p.members))
	for _, m := range p.members {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Alive returns the alive members with the given role (any role when empty), sorted by name.
func (p *Pool) Alive(role string) []Member {
	var out []Member
	for _, m := range p.Members() {
		if m.Status == StatusAlive && (role == "" || m.Meta.Role == role) {
			out = append(out, m)
		}
	}
	return out
}

// Member returns one member by name.
func (p *Pool) Member(name string) (Member, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.members[name]
	return m, ok
}

// Subscribe returns a stream of member changes. A subscriber that does not keep up is cut off: its channel is
// closed and it should resubscribe and reread Members. Nothing is buffered without bound.
func (p *Pool) Subscribe() (<-chan Event, func()) {
	ch := make(chan Event, 256)
	p.mu.Lock()
	p.subs[ch] = struct{}{}
	p.mu.Unlock()
	return ch, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, ok := p.subs[ch]; ok {
			delete(p.subs, ch)
			close(ch)
		}
	}
}

// UpdateMeta changes this member's metadata and gossips it.
func (p *Pool) UpdateMeta(m Meta) error {
	p.mu.Lock()
	p.meta = m
	p.mu.Unlock()
	return p.ml.UpdateNode(5 * time.Second)
}

// Leave tells the pool this member is going away, waiting up to timeout for the message to spread.
//
// The Leaving metadata alone is not enough: it spreads by gossip, and memberlist's own leave message may
// reach a member first, which then reports a failure. So the intent is also sent to each alive member over
// memberlist's reliable (TCP) channel before the leave itself.
func (p *Pool) Leave(timeout time.Duration) error {
	p.mu.Lock()
	p.meta.Leaving = true
	intent, _ := json.Marshal(leaveIntent{Name: p.cfg.Name, BootID: p.meta.BootID})
	p.mu.Unlock()
	if err := p.ml.UpdateNode(timeout / 3); err != nil {
		p.logger.Warn("announcing leave", "error", err)
	}
	p.sendToAlive(append([]byte{msgLeaveIntent}, intent...), timeout/3)
	return p.ml.Leave(timeout / 3)
}

// User messages between pool members; the first byte is the type.
const msgLeaveIntent byte = 'L'

type leaveIntent struct {
	Name   string `json:"n"`
	BootID string `json:"b"`
}

// sendToAlive sends msg to every other alive member at once, waiting at most timeout for them all.
//
// The members come from the pool's own table, not memberlist's Members(): those are pointers into
// memberlist's state, whose address fields it rewrites under its own lock when a member's alive message comes
// (a leaving member's metadata update, say), and SendReliable reads them without it (a data race seen under
// -race when two members left at once).
func (p *Pool) sendToAlive(msg []byte, timeout time.Duration) {
	var wg sync.WaitGroup
	for _, m := range p.Alive("") {
		if m.Name == p.cfg.Name {
			continue
		}
		host, port, err := net.SplitHostPort(m.Addr)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			continue
		}
		node := &memberlist.Node{Name: m.Name, Addr: net.ParseIP(host), Port: uint16(n)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.ml.SendReliable(node, msg); err != nil {
				p.logger.Debug("sending to member", "member", node.Name, "error", err)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
	}
}

// receiveLeaveIntent records a member's announced leave; when memberlist already reported that member's
// leave as a failure, it corrects the member to left.
func (p *Pool) receiveLeaveIntent(b []byte) {
	var in leaveIntent
	if err := json.Unmarshal(b, &in); err != nil || in.Name == "" {
		p.logger.Warn("unreadable leave intent", "error", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leaveIntents[in.Name] = in.BootID
	if m, ok := p.members[in.Name]; ok && m.Status == StatusDead && m.Meta.BootID == in.BootID {
		m.Status = StatusLeft
		p.setLocked(EventLeave, m)
	}
}

// Shutdown stops the member without leaving (others will see it fail).
func (p *Pool) Shutdown() error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.wg.Wait()
	return p.ml.Shutdown()
}

func (p *Pool) record(t EventType, n *memberlist.Node) {
	m := Member{Name: n.Name, Addr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))), Status: StatusAlive}
	if err := json.Unmarshal(n.Meta, &m.Meta); err != nil && len(n.Meta) > 0 {
		p.logger.Warn("member sent unreadable metadata", "member", n.Name, "error", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// memberlist does not fill n.State in its notifications; the event type, the leaving flag and a leave
	// intent received from this run of the member tell.
	announced := m.Meta.Leaving
	if boot, ok := p.leaveIntents[m.Name]; ok {
		if t == EventJoin {
			delete(p.leaveIntents, m.Name)
		} else if boot == m.Meta.BootID {
			announced = true
		}
	}
	switch {
	case announced:
		m.Status = StatusLeft
	case t == EventLeave:
		m.Status = StatusDead
	}
	if t == EventLeave {
		// As Serf logs EventMemberFailed and EventMemberLeave: when this member learned it, whether by its own
		// suspicion running out or from another member.
		p.logger.Info("member "+string(m.Status), "member", m.Name)
	}
	p.setLocked(t, m)
}

// setLocked stores a member and tells the subscribers. p.mu is held.
func (p *Pool) setLocked(t EventType, m Member) {
	p.members[m.Name] = m
	p.peersDirty = true
	ev := Event{Type: t, Member: m}
	for ch := range p.subs {
		select {
		case ch <- ev:
		default:
			delete(p.subs, ch)
			close(ch)
		}
	}
}

// events receives memberlist's notifications.
type events Pool

func (e *events) NotifyJoin(n *memberlist.Node)   { (*Pool)(e).record(EventJoin, n) }
func (e *events) NotifyLeave(n *memberlist.Node)  { (*Pool)(e).record(EventLeave, n) }
func (e *events) NotifyUpdate(n *memberlist.Node) { (*Pool)(e).record(EventUpdate, n) }

// delegate serves this member's metadata.
type delegate Pool

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.meta
	m.KeyringHash = d.keyringHash
	b, _ := json.Marshal(m)
	if len(b) > limit {
		(*Pool)(d).logger.Error("member metadata exceeds the gossip limit; sending none", "bytes", len(b), "limit", limit)
		return nil
	}
	return b
}
func (d *delegate) NotifyMsg(b []byte) {
	if len(b) > 0 && b[0] == msgLeaveIntent {
		(*Pool)(d).receiveLeaveIntent(b[1:])
	}
}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}
