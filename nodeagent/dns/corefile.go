package dns

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"text/template"

	"github.com/coredns/caddy/caddyfile"
)

// Plugins are the CoreDNS plugins the agent embeds, in the order CoreDNS runs them on a query (the order of
// CoreDNS's own plugin.cfg). bind is there because it is the only way to choose a listen address; the rest
// are the cluster DNS's needs: answers for the cluster domain (kubernetes), other names from the node's
// resolvers (forward), a cache, error logging, loop detection, a health endpoint and Prometheus metrics.
var Plugins = []string{"bind", "health", "prometheus", "errors", "cache", "kubernetes", "loop", "forward"}

// Params are what a Corefile template may refer to.
type Params struct {
	// ClusterDomain is the cluster's DNS domain without a trailing dot, e.g. cluster.local ({{.ClusterDomain}}).
	ClusterDomain string
	// Bind is the address CoreDNS listens on ({{.Bind}}): the node's pod bridge gateway address.
	Bind string
	// Port is the DNS port ({{.Port}}), 53 outside tests.
	Port int
	// Kubeconfig is the file the kubernetes plugin reads its API access from ({{.Kubeconfig}}).
	Kubeconfig string
	// HealthAddr and MetricsAddr are host:port of the health and Prometheus endpoints ({{.HealthAddr}},
	// {{.MetricsAddr}}).
	HealthAddr, MetricsAddr string
	// Upstream is where other names are forwarded ({{.Upstream}}): a resolv.conf path or addresses.
	Upstream string
}

// DefaultCorefile is the Corefile an agent runs unless agent.dns.corefile overrides it. It is Kubernetes'
// own default (kubeadm's CoreDNS ConfigMap) bound to one address: `pods insecure` answers pod A records
// without checking the pod exists, as kube-dns did; reverse lookups the cluster does not own fall through
// to the node's resolvers. The loop plugin is compiled in but not used by default: on finding a forwarding
// loop it ends the process, which here is the whole agent, not a CoreDNS pod that would be restarted.
const DefaultCorefile = `.:{{.Port}} {
    bind {{.Bind}}
    errors
    health {{.HealthAddr}}
    kubernetes {{.ClusterDomain}} in-addr.arpa ip6.arpa {
        kubeconfig {{.Kubeconfig}}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    prometheus {{.MetricsAddr}}
    forward . {{.Upstream}}
    cache 30
}
`

// Render fills a Corefile template. Placeholders never span lines, so line N of the template is line N
// of the result, and errors found later still point at the operator's line.
func Render(tmpl string, p Params) (string, error) {
	t, err := template.New("Corefile").Option("missingkey=error").Parse(tmpl)
	if err != nil {
		return "", templateError(err)
	}
	var out bytes.Buffer
	if err := t.Execute(&out, p); err != nil {
		return "", templateError(err)
	}
	return out.String(), nil
}

// LineError is a problem at a line of a Corefile (0 when the line is not known).
type LineError struct {
	Line int
	Msg  string
}

func (e *LineError) Error() string {
	if e.Line == 0 {
		return "Corefile: " + e.Msg
	}
	return fmt.Sprintf("Corefile line %d: %s", e.Line, e.Msg)
}

// caddyLine finds the "Corefile:12 - " prefix caddy puts on parse and setup errors.
var caddyLine = regexp.MustCompile(`^(.*?)Corefile:(\d+) - (.*)$`)

// templateLine finds the "template: Corefile:12:" prefix of text/template errors.
var templateLine = regexp.MustCompile(`template: Corefile:(\d+):(?:\d+:)? ?(.*)`)

// lineError turns an error from caddy (parsing or a plugin's setup) into a LineError where it names a line.
func lineError(err error) *LineError {
	msg := err.Error()
	if m := caddyLine.FindStringSubmatch(msg); m != nil {
		// A plugin's setup error starts "plugin/<name>: "; keep the name, it says whose argument is wrong.
		n, _ := strconv.Atoi(m[2])
		return &LineError{Line: n, Msg: m[1] + strings.TrimPrefix(m[3], "Error during parsing: ")}
	}
	return &LineError{Msg: msg}
}

func templateError(err error) *LineError {
	if m := templateLine.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return &LineError{Line: n, Msg: m[2]}
	}
	return &LineError{Msg: err.Error()}
}

// Validate renders a Corefile template with placeholder values and checks its syntax and that it uses only
// the embedded plugins. It cannot check a plugin's arguments: those are checked when CoreDNS starts, and
// [Start] reports them with their line too. Errors are *LineError.
func Validate(tmpl string) error {
	text, err := Render(tmpl, Params{ClusterDomain: "cluster.local", Bind: "10.0.0.1", Port: 53,
		Kubeconfig: "/kubeconfig", HealthAddr: "10.0.0.1:8080", MetricsAddr: "10.0.0.1:9153", Upstream: "/etc/resolv.conf"})
	if err != nil {
		return err
	}
	blocks, err := caddyfile.Parse("Corefile", strings.NewReader(text), Plugins)
	if err != nil {
		return lineError(err)
	}
	if len(blocks) == 0 {
		return &LineError{Msg: "has no server block"}
	}
	return nil
}
