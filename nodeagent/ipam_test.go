package nodeagent

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestIPPool(t *testing.T) {
	p, err := newIPPool("10.1.2.0/29") // hosts .2 to .6: .0 is the network, .1 the gateway, .7 broadcast
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := 0; i < 6; i++ {
		got = append(got, p.allocate(types.UID(fmt.Sprint(i))))
	}
	if fmt.Sprint(got) != "[10.1.2.2 10.1.2.3 10.1.2.4 10.1.2.5 10.1.2.6 ]" {
		t.Fatalf("allocated %v", got)
	}
	p.release("10.1.2.4")
	if ip := p.allocate("again"); ip != "10.1.2.4" {
		t.Fatalf("after a release allocated %q", ip)
	}
	if _, err := newIPPool("not-a-cidr"); err == nil {
		t.Fatal("accepted a bad CIDR")
	}
}
