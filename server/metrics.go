package server

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/internal/cachetransform"
)

// The servers answer the metrics.k8s.io API (kubectl top) themselves, with what metrics-server would
// answer: every 15 s a metricsScraper fetches each node agent's resource metrics endpoint (the kubelet's
// /metrics/resource), keeps the last two samples of each node and container, and derives usage from them
// as metrics-server does. CPU is a rate: the difference of the cumulative CPU seconds over the time between
// the two samples' timestamps, which is the window; the timestamp is the newer sample's. Memory is the newer
// working set.

const (
	metricsScrapeInterval = 15 * time.Second // metrics-server's default --metric-resolution
	metricsScrapeTimeout  = 10 * time.Second
	metricsScrapeParallel = 16
	// metricsMaxBody bounds what one agent may send: about 300 bytes a series, so room for thousands of
	// containers.
	metricsMaxBody = 16 << 20
)

// metricsScraper gathers the node agents' resource metrics; it is the API's apiserver.MetricsSource.
type metricsScraper struct {
	client *http.Client
	nodes  func() ([]*corev1.Node, error)
	url    func(*corev1.Node) (string, bool)
	logger hclog.Logger

	interval, timeout time.Duration
	parallel          int
	now               func() time.Time // for samples without a timestamp

	mu      sync.Mutex
	scraped map[string]*scrapedNode // by Node name
	// Published figures, remade after each scrape of a node. They are never changed once made, so readers
	// get them without copying.
	nodeUsage map[string]*metricsv1beta1.NodeMetrics
	podUsage  map[podRef]publishedPod
}

var _ apiserver.MetricsSource = (*metricsScraper)(nil)

// scrapedNode is what the scraper keeps of one node between scrapes.
type scrapedNode struct {
	node       usageSeries
	containers map[containerRef]*usageSeries
	pods       []podRef // the pods published from this node's last scrape
	failing    bool     // the last scrape failed; logged once until it succeeds again
}

type podRef struct{ namespace, name string }

type containerRef struct {
	pod  podRef
	name string
}

type publishedPod struct {
	node    string
	metrics *metricsv1beta1.PodMetrics
}

// usagePoint is one sample of a node or container.
type usagePoint struct {
	cpu    float64   // cumulative core-seconds
	memory float64   // working set, bytes
	at     time.Time // the sample's timestamp
	start  time.Time // the container's start time; zero for a node
}

// usageSeries holds the last two samples of a node or container.
type usageSeries struct{ prev, last *usagePoint }

// add records a new sample. A sample no newer than the last is the same reading again and is ignored. A
// container that restarted (its start time changed) or a counter that went down (a node rebooted) starts
// the series over: a rate across the restart would be meaningless.
func (s *usageSeries) add(p usagePoint) {
	switch {
	case s.last == nil:
	case !p.at.After(s.last.at):
		return
	case p.cpu < s.last.cpu || !p.start.Equal(s.last.start):
		s.prev = nil
	default:
		s.prev = s.last
	}
	s.last = &p
}

// usage is the CPU rate and memory of the last two samples; false until there are two.
func (s *usageSeries) usage() (corev1.ResourceList, metav1.Time, metav1.Duration, bool) {
	if s.prev == nil || s.last == nil {
		return nil, metav1.Time{}, metav1.Duration{}, false
	}
	window := s.last.at.Sub(s.prev.at)
	nanoCores := math.Round((s.last.cpu - s.prev.cpu) / window.Seconds() * 1e9)
	return corev1.ResourceList{
		corev1.ResourceCPU:    *apiresource.NewScaledQuantity(int64(nanoCores), apiresource.Nano),
		corev1.ResourceMemory: *apiresource.NewQuantity(int64(s.last.memory), apiresource.BinarySI),
	}, metav1.NewTime(s.last.at), metav1.Duration{Duration: window}, true
}

// newMetricsScraper returns a scraper of the agents of the Nodes that nodes lists, reached through client
// (which must present the servers' client certificate and trust the agents' serving certificates) at the
// base URL that url gives (agentURL when nil). Nothing happens until Run.
func newMetricsScraper(client *http.Client, nodes func() ([]*corev1.Node, error), url func(*corev1.Node) (string, bool), logger hclog.Logger) *metricsScraper {
	if url == nil {
		url = agentURL
	}
	return &metricsScraper{
		client: client, nodes: nodes, url: url, logger: logger.Named("metrics"),
		interval: metricsScrapeInterval, timeout: metricsScrapeTimeout, parallel: metricsScrapeParallel, now: time.Now,
		scraped: map[string]*scrapedNode{}, nodeUsage: map[string]*metricsv1beta1.NodeMetrics{}, podUsage: map[podRef]publishedPod{},
	}
}

// agentURL is the base URL of a Node's agent: https://<InternalIP>:<daemonEndpoints.kubeletEndpoint.port>,
// where kube-apiserver would reach its kubelet. False when the Node reports no port or no InternalIP.
func agentURL(node *corev1.Node) (string, bool) {
	port := node.Status.DaemonEndpoints.KubeletEndpoint.Port
	if port <= 0 {
		return "", false
	}
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && a.Address != "" {
			return "https://" + net.JoinHostPort(a.Address, strconv.Itoa(int(port))), true
		}
	}
	return "", false
}

// Run scrapes every node at once and then every interval, until ctx ends.
func (s *metricsScraper) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.scrape(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// NodeMetrics implements apiserver.MetricsSource.
func (s *metricsScraper) NodeMetrics(name string) (*metricsv1beta1.NodeMetrics, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.nodeUsage[name]
	return m, ok
}

// PodMetrics implements apiserver.MetricsSource.
func (s *metricsScraper) PodMetrics(namespace, name string) (*metricsv1beta1.PodMetrics, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.podUsage[podRef{namespace, name}]
	return p.metrics, ok
}

// scrape runs one round: each listed Node's agent, at most parallel at a time, and forgets the nodes no
// longer listed or without an endpoint.
func (s *metricsScraper) scrape(ctx context.Context) {
	nodes, err := s.nodes()
	if err != nil {
		s.logger.Warn("listing nodes to scrape", "error", err)
		return
	}
	keep := map[string]bool{}
	sem := make(chan struct{}, s.parallel)
	var wg sync.WaitGroup
	for _, node := range nodes {
		base, ok := s.url(node)
		if !ok {
			continue
		}
		keep[node.Name] = true
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			sc, err := s.fetch(ctx, base)
			if ctx.Err() != nil {
				return // shutting down: not the agent's failure
			}
			s.apply(node.Name, sc, err)
		}()
	}
	wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.scraped {
		if !keep[name] {
			s.unpublishLocked(name)
			delete(s.scraped, name)
		}
	}
}

// nodeScrape is one parsed scrape of an agent.
type nodeScrape struct {
	node       *usagePoint
	containers map[containerRef]usagePoint
}

func (s *metricsScraper) fetch(ctx context.Context, base string) (*nodeScrape, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics/resource", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.FmtText))
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s: %s", req.URL, resp.Status, strings.TrimSpace(string(body)))
	}
	return parseResourceMetrics(io.LimitReader(resp.Body, metricsMaxBody), s.now())
}

// parseResourceMetrics reads the node and container series of a resource metrics endpoint. A sample
// without a timestamp is taken as of now; a container without both CPU and memory is left out.
func parseResourceMetrics(r io.Reader, now time.Time) (*nodeScrape, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing resource metrics: %w", err)
	}
	sc := &nodeScrape{containers: map[containerRef]usagePoint{}}
	type partial struct {
		usagePoint
		hasCPU, hasMemory bool
	}
	var node partial
	containers := map[containerRef]*partial{}
	container := func(m *dto.Metric) *partial {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ref := containerRef{podRef{labels["namespace"], labels["pod"]}, labels["container"]}
		if ref.name == "" || ref.pod.name == "" {
			return nil
		}
		if containers[ref] == nil {
			containers[ref] = &partial{}
		}
		return containers[ref]
	}
	at := func(m *dto.Metric) time.Time {
		if m.TimestampMs == nil {
			return now
		}
		return time.UnixMilli(m.GetTimestampMs())
	}
	// Each family, what a sample of it sets.
	setters := map[string]func(m *dto.Metric, v float64){
		"node_cpu_usage_seconds_total":  func(m *dto.Metric, v float64) { node.cpu, node.at, node.hasCPU = v, at(m), true },
		"node_memory_working_set_bytes": func(m *dto.Metric, v float64) { node.memory, node.hasMemory = v, true },
		"container_cpu_usage_seconds_total": func(m *dto.Metric, v float64) {
			if c := container(m); c != nil {
				c.cpu, c.at, c.hasCPU = v, at(m), true
			}
		},
		"container_memory_working_set_bytes": func(m *dto.Metric, v float64) {
			if c := container(m); c != nil {
				c.memory, c.hasMemory = v, true
			}
		},
		"container_start_time_seconds": func(m *dto.Metric, v float64) {
			if c := container(m); c != nil {
				sec, frac := math.Modf(v)
				c.start = time.Unix(int64(sec), int64(frac*1e9))
			}
		},
	}
	for name, set := range setters {
		for _, m := range families[name].GetMetric() {
			set(m, sampleValue(m))
		}
	}
	if node.hasCPU && node.hasMemory {
		sc.node = &node.usagePoint
	}
	for ref, c := range containers {
		if c.hasCPU && c.hasMemory {
			sc.containers[ref] = c.usagePoint
		}
	}
	return sc, nil
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	default:
		return m.Untyped.GetValue()
	}
}

// apply records a node's scrape and publishes its figures; a failed scrape withdraws them (stale figures
// would mislead) but keeps the samples, so the next success has a rate at once.
func (s *metricsScraper) apply(name string, sc *nodeScrape, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.scraped[name]
	if st == nil {
		st = &scrapedNode{containers: map[containerRef]*usageSeries{}}
		s.scraped[name] = st
	}
	s.unpublishLocked(name)
	if err != nil {
		if !st.failing {
			s.logger.Warn("scraping a node's resource metrics", "node", name, "error", err)
		} else {
			s.logger.Debug("scraping a node's resource metrics", "node", name, "error", err)
		}
		st.failing = true
		return
	}
	if st.failing {
		s.logger.Info("scraping a node's resource metrics works again", "node", name)
		st.failing = false
	}
	if sc.node != nil {
		st.node.add(*sc.node)
	}
	// Containers not in this scrape are gone; their series go with them.
	containers := make(map[containerRef]*usageSeries, len(sc.containers))
	for ref, p := range sc.containers {
		series := st.containers[ref]
		if series == nil {
			series = &usageSeries{}
		}
		series.add(p)
		containers[ref] = series
	}
	st.containers = containers

	if usage, ts, window, ok := st.node.usage(); ok {
		s.nodeUsage[name] = &metricsv1beta1.NodeMetrics{Timestamp: ts, Window: window, Usage: usage}
	}
	// A pod has metrics once each of its containers has, with the earliest container's time, as
	// metrics-server reports it.
	byPod := map[podRef][]containerRef{}
	for ref := range containers {
		byPod[ref.pod] = append(byPod[ref.pod], ref)
	}
	for pod, refs := range byPod {
		slices.SortFunc(refs, func(a, b containerRef) int { return strings.Compare(a.name, b.name) })
		m := &metricsv1beta1.PodMetrics{}
		complete := true
		for _, ref := range refs {
			usage, ts, window, ok := containers[ref].usage()
			if !ok {
				complete = false
				break
			}
			m.Containers = append(m.Containers, metricsv1beta1.ContainerMetrics{Name: ref.name, Usage: usage})
			if m.Timestamp.IsZero() || ts.Before(&m.Timestamp) {
				m.Timestamp, m.Window = ts, window
			}
		}
		if complete {
			s.podUsage[pod] = publishedPod{node: name, metrics: m}
			st.pods = append(st.pods, pod)
		}
	}
}

// unpublishLocked withdraws the figures of a node and of the pods last published from it. A pod published
// since by another node (deleted and made again there, under the same name) stays.
func (s *metricsScraper) unpublishLocked(name string) {
	delete(s.nodeUsage, name)
	st := s.scraped[name]
	if st == nil {
		return
	}
	for _, pod := range st.pods {
		if s.podUsage[pod].node == name {
			delete(s.podUsage, pod)
		}
	}
	st.pods = st.pods[:0]
}

// nodeLister lists the Nodes from an informer on this peer's own API, started in the background once the
// API answers; until it has synced, the list is empty.
func (s *Server) nodeLister(ctx context.Context) func() ([]*corev1.Node, error) {
	var lister atomic.Pointer[corelisters.NodeLister]
	go func() {
		client, err := s.adminClient(ctx)
		if err != nil {
			return
		}
		factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(cachetransform.SharedWith(s.shared)))
		nodes := factory.Core().V1().Nodes()
		l := nodes.Lister()
		factory.Start(ctx.Done())
		if cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
			lister.Store(&l)
		}
	}()
	return func() ([]*corev1.Node, error) {
		l := lister.Load()
		if l == nil {
			return nil, nil
		}
		return (*l).List(labels.Everything())
	}
}
