package nodeagent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"

	"github.com/skiff-dev/skiff/gossip"
)

// Announcing load balancer addresses, as MetalLB's layer 2 mode does. One node at a time answers for each
// address of a LoadBalancer Service (status.loadBalancer.ingress, which the servers' controller writes): it
// answers ARP requests for the address on its uplink, and says so with gratuitous ARP when it takes the
// address over; every node's proxy has the address's rules, so the node that gets the traffic serves it.
// Every agent chooses alike, with no coordination: among the agents alive in the gossip pool (with a ready
// endpoint of the Service on their node, for externalTrafficPolicy Local; never a node labelled
// node.kubernetes.io/exclude-from-external-load-balancers), the one whose name hashes lowest with the
// address. When that agent dies, the pool marks it dead within its suspicion time and the next one takes the
// address.
//
// The address is not configured on the interface: the kernel would go on answering ARP for it after the
// agent died (a crashed agent, a live node), and two nodes would answer. The agent answers in user space, on
// a raw socket, so its answers end with it.

// lbAnnounceInterval is how often the agent recomputes which addresses it answers for, besides on every
// gossip event.
const lbAnnounceInterval = time.Second

// announceLoadBalancers answers for the load balancer addresses this node is chosen for, until ctx ends.
func (a *Agent) announceLoadBalancers(ctx context.Context, pool *gossip.Pool) {
	logger := a.logger.Named("lb-announce")
	uplink, err := interfaceWithAddr(a.cfg.AdvertiseAddr)
	if err != nil {
		logger.Warn("no load balancer addresses announced from this node", "error", err)
		return
	}
	responder, err := newARPResponder(uplink)
	if err != nil {
		logger.Warn("no load balancer addresses announced from this node", "interface", uplink.Name, "error", err)
		return
	}
	defer responder.close()
	go responder.serve(ctx)

	factory := informers.NewSharedInformerFactory(a.client, 0)
	services := factory.Core().V1().Services().Lister()
	slicesLister := factory.Discovery().V1().EndpointSlices().Lister()
	nodes := factory.Core().V1().Nodes().Lister()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for _, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			return
		}
	}
	events, stop := pool.Subscribe()
	defer stop()
	tick := time.NewTicker(lbAnnounceInterval)
	defer tick.Stop()
	for {
		alive := map[string]bool{}
		for _, m := range pool.Alive(gossip.RoleAgent) {
			for _, n := range m.Meta.Nodes {
				alive[n] = true
			}
		}
		excluded, _ := nodes.List(excludedFromLoadBalancers)
		for _, n := range excluded {
			delete(alive, n.Name)
		}
		svcs, _ := services.List(labels.Everything())
		endpointSlices, _ := slicesLister.List(labels.Everything())
		want := announcedBy(a.cfg.Name, svcs, endpointSlices, alive)
		addrs := make([]netip.Addr, 0, len(want))
		for _, w := range want {
			addrs = append(addrs, w.ip)
		}
		for _, ip := range responder.set(addrs) {
			logger.Info("answering for a load balancer address", "address", ip, "interface", uplink.Name)
			responder.gratuitous(ip)
			for _, w := range want {
				if w.ip == ip {
					a.recorder.Eventf(w.svc, corev1.EventTypeNormal, "LoadBalancerAnnounced", "node %s answers for %s", a.cfg.Name, ip)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-events:
		case <-tick.C:
		}
	}
}

// excludedFromLoadBalancers selects the nodes that never answer for a load balancer address: those with
// Kubernetes' node.kubernetes.io/exclude-from-external-load-balancers label (any value), which cloud
// controllers honour the same way. Their proxies still serve traffic that reaches them.
var excludedFromLoadBalancers = func() labels.Selector {
	req, err := labels.NewRequirement(corev1.LabelNodeExcludeBalancers, selection.Exists, nil)
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*req)
}()

// announcement is a load balancer address and its Service.
type announcement struct {
	ip  netip.Addr
	svc *corev1.Service
}

// announcedBy are the load balancer addresses node answers for: those it wins among the alive nodes that
// may serve each (for externalTrafficPolicy Local, those with a ready endpoint of the Service), in order.
func announcedBy(node string, services []*corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, alive map[string]bool) []announcement {
	ready := map[string]map[string]bool{} // namespace/service -> nodes with a ready endpoint
	for _, s := range endpointSlices {
		key := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		for _, e := range s.Endpoints {
			if e.NodeName != nil && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				if ready[key] == nil {
					ready[key] = map[string]bool{}
				}
				ready[key][*e.NodeName] = true
			}
		}
	}
	var out []announcement
	for _, svc := range services {
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		candidates := alive
		if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
			candidates = map[string]bool{}
			for n := range ready[svc.Namespace+"/"+svc.Name] {
				if alive[n] {
					candidates[n] = true
				}
			}
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			ip, err := netip.ParseAddr(in.IP)
			if err != nil || !ip.Is4() || (in.IPMode != nil && *in.IPMode != corev1.LoadBalancerIPModeVIP) {
				continue
			}
			if chooseAnnouncer(ip, candidates) == node && !slices.ContainsFunc(out, func(a announcement) bool { return a.ip == ip }) {
				out = append(out, announcement{ip, svc})
			}
		}
	}
	slices.SortFunc(out, func(x, y announcement) int { return x.ip.Compare(y.ip) })
	return out
}

// chooseAnnouncer is the node that answers for ip: the candidate whose name hashes lowest with it, so that
// each address has its own order of nodes and a node's death moves only its own addresses.
func chooseAnnouncer(ip netip.Addr, candidates map[string]bool) string {
	best, bestHash := "", uint64(0)
	for n := range candidates {
		h := fnv.New64a()
		h.Write([]byte(ip.String() + "\x00" + n))
		if v := h.Sum64(); best == "" || v < bestHash || (v == bestHash && n < best) {
			best, bestHash = n, v
		}
	}
	return best
}

// interfaceWithAddr is the interface that holds ip: the node's uplink.
func interfaceWithAddr(ip string) (*net.Interface, error) {
	want := net.ParseIP(ip)
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for i := range ifaces {
		addrs, _ := ifaces[i].Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.Equal(want) && len(ifaces[i].HardwareAddr) == 6 {
				return &ifaces[i], nil
			}
		}
	}
	return nil, fmt.Errorf("no Ethernet interface holds the node address %s", ip)
}

// arpResponder answers ARP requests for a set of addresses on one interface, from a raw socket.
type arpResponder struct {
	iface *net.Interface
	fd    int
	mu    sync.Mutex
	held  []netip.Addr
}

// ARP over Ethernet, as RFC 826 lays it out after the 14-byte Ethernet header.
const (
	etherTypeARP  = 0x0806
	arpFrameLen   = 14 + 28
	arpOpRequest  = 1
	arpOpReply    = 2
	arpReadTimout = 500 * time.Millisecond
)

func newARPResponder(iface *net.Interface) (*arpResponder, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(etherTypeARP)))
	if err != nil {
		return nil, fmt.Errorf("opening a raw ARP socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(etherTypeARP), Ifindex: iface.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding the ARP socket to %s: %w", iface.Name, err)
	}
	tv := unix.NsecToTimeval(arpReadTimout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &arpResponder{iface: iface, fd: fd}, nil
}

func (r *arpResponder) close() { unix.Close(r.fd) }

// set replaces the addresses answered for and returns those that are new.
func (r *arpResponder) set(addrs []netip.Addr) (added []netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range addrs {
		if !slices.Contains(r.held, a) {
			added = append(added, a)
		}
	}
	r.held = addrs
	return added
}

func (r *arpResponder) holds(a netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.held, a)
}

// serve answers requests until ctx ends.
func (r *arpResponder) serve(ctx context.Context) {
	buf := make([]byte, 1500)
	for ctx.Err() == nil {
		n, _, err := unix.Recvfrom(r.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if n < arpFrameLen || binary.BigEndian.Uint16(buf[12:14]) != etherTypeARP {
			continue
		}
		arp := buf[14:arpFrameLen]
		if binary.BigEndian.Uint16(arp[6:8]) != arpOpRequest || arp[4] != 6 || arp[5] != 4 {
			continue
		}
		target := netip.AddrFrom4([4]byte(arp[24:28]))
		if !r.holds(target) {
			continue
		}
		requester := net.HardwareAddr(slices.Clone(arp[8:14]))
		var sender [4]byte
		copy(sender[:], arp[14:18])
		r.send(arpOpReply, requester, target, requester, netip.AddrFrom4(sender))
	}
}

// gratuitous announces that this interface has ip, as a broadcast request for ip from ip, three times.
func (r *arpResponder) gratuitous(ip netip.Addr) {
	broadcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	for i := range 3 {
		if i > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		r.send(arpOpRequest, broadcast, ip, broadcast, ip)
	}
}

// send writes one ARP frame: op from (this interface's MAC, senderIP) to (targetMAC, targetIP), to dst.
func (r *arpResponder) send(op uint16, dst net.HardwareAddr, senderIP netip.Addr, targetMAC net.HardwareAddr, targetIP netip.Addr) {
	frame := make([]byte, arpFrameLen)
	copy(frame[0:6], dst)
	copy(frame[6:12], r.iface.HardwareAddr)
	binary.BigEndian.PutUint16(frame[12:14], etherTypeARP)
	arp := frame[14:]
	binary.BigEndian.PutUint16(arp[0:2], 1)      // Ethernet
	binary.BigEndian.PutUint16(arp[2:4], 0x0800) // IPv4
	arp[4], arp[5] = 6, 4
	binary.BigEndian.PutUint16(arp[6:8], op)
	copy(arp[8:14], r.iface.HardwareAddr)
	s4, t4 := senderIP.As4(), targetIP.As4()
	copy(arp[14:18], s4[:])
	copy(arp[18:24], targetMAC)
	copy(arp[24:28], t4[:])
	var to [8]byte
	copy(to[:], dst)
	_ = unix.Sendto(r.fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: r.iface.Index, Halen: 6, Addr: to, Protocol: htons(etherTypeARP)})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
