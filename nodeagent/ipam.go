package nodeagent

import (
	"encoding/binary"
	"fmt"
	"net"

	"k8s.io/apimachinery/pkg/types"
)

// ipPool hands out the host addresses of a pod CIDR, skipping the network address, the gateway (.1, the
// bridge's) and the broadcast address, as the host-local IPAM plugin does.
type ipPool struct {
	base, size uint32
	next       uint32
	used       map[uint32]types.UID
}

func newIPPool(cidr string) (*ipPool, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil || n.IP.To4() == nil {
		return nil, fmt.Errorf("pod CIDR %q is not an IPv4 CIDR", cidr)
	}
	ones, bits := n.Mask.Size()
	return &ipPool{base: binary.BigEndian.Uint32(n.IP.To4()), size: 1 << (bits - ones), next: 2, used: map[uint32]types.UID{}}, nil
}

// allocate returns a free address, or "" when the pool is full.
func (p *ipPool) allocate(uid types.UID) string {
	for i := uint32(0); i+3 < p.size; i++ {
		off := 2 + (p.next-2+i)%(p.size-3)
		if _, taken := p.used[off]; !taken {
			p.used[off] = uid
			p.next = off + 1
			ip := make(net.IP, 4)
			binary.BigEndian.PutUint32(ip, p.base+off)
			return ip.String()
		}
	}
	return ""
}

func (p *ipPool) release(ip string) {
	parsed := net.ParseIP(ip).To4()
	if parsed == nil {
		return
	}
	delete(p.used, binary.BigEndian.Uint32(parsed)-p.base)
}
