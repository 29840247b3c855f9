package nodeagent

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

func TestEnvExpansion(t *testing.T) {
	vars := map[string]string{"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""}
	mapping := func(name string) string {
		if v, ok := vars[name]; ok {
			return v
		}
		return "$(" + name + ")"
	}
	tests := []struct{ in, want string }{
		{"$(VAR_A)", "A"},
		{"___$(VAR_B)___", "___B___"},
		{"$(VAR_A)-$(VAR_A)", "A-A"},
		{"$(VAR_A)$(VAR_B)$(VAR_C)", "ABC"},
		{"$(VAR_REF)", "$(VAR_A)"}, // values are not expanded again
		{"$(VAR_EMPTY)", ""},
		{"$(UNKNOWN)", "$(UNKNOWN)"},
		{"$$(VAR_A)", "$(VAR_A)"},
		{"$$$(VAR_A)", "$A"},
		{"$$$$(VAR_A)", "$$(VAR_A)"},
		{"foo$$bar", "foo$bar"},
		{"$(VAR_A", "$(VAR_A"},
		{"$(", "$("},
		{"$", "$"},
		{"a$", "a$"},
		{"$VAR_A", "$VAR_A"},
		{"${VAR_A}", "${VAR_A}"},
		{"$()", "$()"}, // mapping("") is not defined
		{"$(VAR_A)$", "A$"},
		{"", ""},
		{"no vars", "no vars"},
	}
	for _, tt := range tests {
		if got := expandVars(tt.in, mapping); got != tt.want {
			t.Errorf("expandVars(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestContainerEnv(t *testing.T) {
	objs := newFakeObjects()
	objs.addConfigMap("ns", "base", map[string]string{"B": "from-base", "A": "from-base", "SHARED": "base"}, nil)
	objs.addConfigMap("ns", "over", map[string]string{"SHARED": "over", "EXTRA": "x"}, nil)
	objs.addConfigMap("ns", "cfg", map[string]string{"level": "debug"}, nil)
	objs.addSecret("ns", "creds", map[string][]byte{"user": []byte("admin"), "pass": []byte("s3cr$t")})
	alloc := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	fieldRef := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}
	}
	resRef := func(res, divisor string) *corev1.EnvVarSource {
		s := &corev1.ResourceFieldSelector{Resource: res}
		if divisor != "" {
			s.Divisor = resource.MustParse(divisor)
		}
		return &corev1.EnvVarSource{ResourceFieldRef: s}
	}
	tests := []struct {
		name    string
		from    []corev1.EnvFromSource
		env     []corev1.EnvVar
		want    []string
		wantErr string
		notFoud bool
		// podLimits are the pod's spec.resources.limits (pod-level resources).
		podLimits corev1.ResourceList
	}{
		{name: "precedence", from: []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "base"}}},
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "over"}}},
			{Prefix: "DB_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}},
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr(true)}},
		}, env: []corev1.EnvVar{
			{Name: "A", Value: "from-env"},
			{Name: "NEW", Value: "1"},
			{Name: "NEW", Value: "2"},
			{Name: "EMPTY"},
		}, want: []string{"A=from-env", "B=from-base", "SHARED=over", "EXTRA=x", "DB_pass=s3cr$t", "DB_user=admin", "NEW=2", "EMPTY="}},
		{name: "expansion", from: []corev1.EnvFromSource{
			{Prefix: "DB_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}},
		}, env: []corev1.EnvVar{
			{Name: "URL", Value: "postgres://$(DB_user):$(DB_pass)@$(HOST)/db"}, // HOST is defined later: left as is
			{Name: "HOST", Value: "db.local"},
			{Name: "URL2", Value: "$(DB_user)@$(HOST)"},
			{Name: "ESCAPED", Value: "$$(HOST) costs $$5 $HOST"},
			{Name: "SELF", Value: "x$(SELF)"},
			{Name: "LEVEL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "level"}}},
			{Name: "FROM_REF", Value: "$(LEVEL)"},
		}, want: []string{"DB_pass=s3cr$t", "DB_user=admin", "URL=postgres://admin:s3cr$t@$(HOST)/db", "HOST=db.local", "URL2=admin@db.local",
			"ESCAPED=$(HOST) costs $5 $HOST", "SELF=x$(SELF)", "LEVEL=debug", "FROM_REF=debug"}},
		{name: "fieldRef", env: []corev1.EnvVar{
			{Name: "NAME", ValueFrom: fieldRef("metadata.name")},
			{Name: "NS", ValueFrom: fieldRef("metadata.namespace")},
			{Name: "UID", ValueFrom: fieldRef("metadata.uid")},
			{Name: "APP", ValueFrom: fieldRef("metadata.labels['app']")},
			{Name: "NOTE", ValueFrom: fieldRef("metadata.annotations['note']")},
			{Name: "NOLABEL", ValueFrom: fieldRef("metadata.labels['none']")},
			{Name: "NODE", ValueFrom: fieldRef("spec.nodeName")},
			{Name: "SA", ValueFrom: fieldRef("spec.serviceAccountName")},
			{Name: "HOST_IP", ValueFrom: fieldRef("status.hostIP")},
			{Name: "HOST_IPS", ValueFrom: fieldRef("status.hostIPs")},
			{Name: "POD_IP", ValueFrom: fieldRef("status.podIP")},
			{Name: "POD_IPS", ValueFrom: fieldRef("status.podIPs")},
		}, want: []string{"NAME=web-0", "NS=ns", "UID=uid-1", "APP=web", `NOTE=say "hi"`, "NOLABEL=", "NODE=node-a", "SA=sa",
			"HOST_IP=10.0.0.1", "HOST_IPS=10.0.0.1,fd00::1", "POD_IP=10.244.0.5", "POD_IPS=10.244.0.5,fd00:244::5"}},
		{name: "resourceFieldRef", env: []corev1.EnvVar{
			{Name: "CPU_M", ValueFrom: resRef("limits.cpu", "1m")},
			{Name: "CPU", ValueFrom: resRef("limits.cpu", "")},
			{Name: "REQ_CPU_M", ValueFrom: resRef("requests.cpu", "1m")},
			{Name: "MEM_MI", ValueFrom: resRef("limits.memory", "1Mi")},
			{Name: "MEM", ValueFrom: resRef("limits.memory", "")},
			{Name: "REQ_MEM_MI", ValueFrom: resRef("requests.memory", "1Mi")},
			{Name: "REQ_MEM_K", ValueFrom: resRef("requests.memory", "1k")},
			{Name: "EPH_GI", ValueFrom: resRef("limits.ephemeral-storage", "1Gi")}, // unset: node allocatable
			{Name: "REQ_EPH", ValueFrom: resRef("requests.ephemeral-storage", "")}, // unset: 0
			{Name: "OTHER_CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				ContainerName: "sidecar", Resource: "limits.cpu", Divisor: resource.MustParse("1m")}}}, // unset: node allocatable
			// The sidecar has no requests at all: they read as 0, as in the conformance pods' downward API volumes.
			{Name: "OTHER_REQ_CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				ContainerName: "sidecar", Resource: "requests.cpu"}}},
			{Name: "OTHER_REQ_MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				ContainerName: "sidecar", Resource: "requests.memory"}}},
		}, want: []string{"CPU_M=500", "CPU=1", "REQ_CPU_M=250", "MEM_MI=64", "MEM=67108864", "REQ_MEM_MI=32", "REQ_MEM_K=33555",
			"EPH_GI=100", "REQ_EPH=0", "OTHER_CPU=4000", "OTHER_REQ_CPU=0", "OTHER_REQ_MEM=0"}},
		{name: "pod-level limits", podLimits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}, env: []corev1.EnvVar{
			// The sidecar's unset limits: memory from the pod's spec.resources, cpu from the node.
			{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "sidecar", Resource: "limits.cpu"}}},
			{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				ContainerName: "sidecar", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
			{Name: "OWN_MEM_MI", ValueFrom: resRef("limits.memory", "1Mi")}, // the container's own limit wins
		}, want: []string{"CPU=4", "MEM_MI=1024", "OWN_MEM_MI=64"}},
		{name: "optional missing", env: []corev1.EnvVar{
			{Name: "KEEP", Value: "set"},
			{Name: "S1", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "k", Optional: ptr(true)}}},
			{Name: "S2", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "none", Optional: ptr(true)}}},
			{Name: "C1", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "k", Optional: ptr(true)}}},
			{Name: "KEEP", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "k", Optional: ptr(true)}}},
			{Name: "USER", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "user"}}},
		}, want: []string{"KEEP=set", "USER=admin"}},
		{name: "missing secret", env: []corev1.EnvVar{
			{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "k"}}},
		}, wantErr: `secret "absent" not found`, notFoud: true},
		{name: "missing envFrom configmap", from: []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}}},
		}, wantErr: `configmap "absent" not found`, notFoud: true},
		{name: "missing configmap key", env: []corev1.EnvVar{
			{Name: "C", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "nope"}}},
		}, wantErr: "couldn't find key nope in ConfigMap ns/cfg"},
		{name: "missing secret key", env: []corev1.EnvVar{
			{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "nope"}}},
		}, wantErr: "couldn't find key nope in Secret ns/creds"},
		{name: "unsupported fieldPath", env: []corev1.EnvVar{{Name: "P", ValueFrom: fieldRef("spec.restartPolicy")}},
			wantErr: "unsupported fieldPath: spec.restartPolicy"},
		{name: "bad subscript", env: []corev1.EnvVar{{Name: "P", ValueFrom: fieldRef("metadata.name['x']")}},
			wantErr: `fieldPath "metadata.name['x']" does not support subscript`},
		{name: "bad api version", env: []corev1.EnvVar{{Name: "P", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v2", FieldPath: "metadata.name"}}}},
			wantErr: "unsupported pod version: v2"},
		{name: "unsupported resource", env: []corev1.EnvVar{{Name: "R", ValueFrom: resRef("limits.gpu", "")}},
			wantErr: "unsupported container resource : limits.gpu"},
		{name: "unsupported resource kind", env: []corev1.EnvVar{{Name: "R", ValueFrom: resRef("usage.cpu", "")}},
			wantErr: "unsupported container resource : usage.cpu"},
		{name: "unknown container", env: []corev1.EnvVar{{Name: "R", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "ghost", Resource: "limits.cpu"}}}},
			wantErr: "container ghost not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod()
			pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "sidecar"})
			if tt.podLimits != nil {
				pod.Spec.Resources = &corev1.ResourceRequirements{Limits: tt.podLimits}
			}
			c := pod.Spec.Containers[0].DeepCopy()
			c.EnvFrom, c.Env = tt.from, tt.env
			got, err := containerEnv(context.Background(), pod, c, objs, alloc, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				if apierrors.IsNotFound(err) != tt.notFoud {
					t.Errorf("IsNotFound(%v) = %v", err, !tt.notFoud)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("env\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

func TestContainerEnvFetchesEachObjectOnce(t *testing.T) {
	objs := newFakeObjects()
	objs.addConfigMap("ns", "cfg", map[string]string{"a": "1", "b": "2"}, nil)
	ref := func(key string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: key}}
	}
	c := &corev1.Container{Name: "app",
		EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
		Env:     []corev1.EnvVar{{Name: "A", ValueFrom: ref("a")}, {Name: "B", ValueFrom: ref("b")}}}
	got, err := containerEnv(context.Background(), testPod(), c, objs, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a=1", "b=2", "A=1", "B=2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("env %q, want %q", got, want)
	}
	if objs.gets != 1 {
		t.Errorf("fetched the ConfigMap %d times", objs.gets)
	}
}

// Every container gets the kubelet's variables of the kubernetes Service, with the lowest precedence: its
// own env wins, and $(VAR) sees them.
func TestMasterServiceEnv(t *testing.T) {
	if got, err := serviceEnv(testPod(), "", nil); err != nil || got != nil {
		t.Fatalf("no service CIDR: %v, %v", got, err)
	}
	c := &corev1.Container{Name: "c", Env: []corev1.EnvVar{
		{Name: "API", Value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
		{Name: "KUBERNETES_SERVICE_PORT", Value: "8443"},
	}}
	services, err := serviceEnv(testPod(), "10.96.0.0/16", nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := containerEnv(context.Background(), testPod(), c, &fakeObjects{}, nil, services)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"API=https://10.96.0.1:443", // expanded before the container's own KUBERNETES_SERVICE_PORT is defined
		"KUBERNETES_SERVICE_PORT=8443",
		"KUBERNETES_SERVICE_HOST=10.96.0.1",
		"KUBERNETES_SERVICE_PORT_HTTPS=443",
		"KUBERNETES_PORT=tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP_PROTO=tcp",
		"KUBERNETES_PORT_443_TCP_PORT=443",
		"KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("env:\n got %q\nwant %q", got, want)
	}
}

// TestServiceLinks checks the kubelet's enableServiceLinks: the Docker-link variables of every Service of the
// pod's namespace that has a ClusterIP, unless the pod opts out; the kubernetes Service's always; and the
// container's own variables win.
func TestServiceLinks(t *testing.T) {
	services := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, svc := range []*corev1.Service{
		testService("ns", "foo", "10.96.0.50", corev1.ServicePort{Port: 80}),
		testService("ns", "my-db", "10.96.0.51", corev1.ServicePort{Name: "sql", Port: 5432}, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}),
		testService("ns", "headless", corev1.ClusterIPNone, corev1.ServicePort{Port: 80}),
		testService("ns", "external", "", corev1.ServicePort{Port: 80}), // an ExternalName Service has no ClusterIP
		testService("other", "bar", "10.96.0.60", corev1.ServicePort{Port: 80}),
		testService("default", "kubernetes", "10.96.0.1", corev1.ServicePort{Name: "https", Port: 443}),
		testService("default", "web", "10.96.0.70", corev1.ServicePort{Port: 8080}),
		testService("shadow", "kubernetes", "10.96.0.80", corev1.ServicePort{Port: 6443}),
		testService("headless-shadow", "kubernetes", corev1.ClusterIPNone, corev1.ServicePort{Port: 6443}),
	} {
		if err := services.Add(svc); err != nil {
			t.Fatal(err)
		}
	}
	lister := corelisters.NewServiceLister(services)

	kubernetes := []string{
		"KUBERNETES_SERVICE_HOST=10.96.0.1",
		"KUBERNETES_SERVICE_PORT=443",
		"KUBERNETES_SERVICE_PORT_HTTPS=443",
		"KUBERNETES_PORT=tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP_PROTO=tcp",
		"KUBERNETES_PORT_443_TCP_PORT=443",
		"KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
	}
	foo := []string{
		"FOO_SERVICE_HOST=10.96.0.50",
		"FOO_SERVICE_PORT=80",
		"FOO_PORT=tcp://10.96.0.50:80",
		"FOO_PORT_80_TCP=tcp://10.96.0.50:80",
		"FOO_PORT_80_TCP_PROTO=tcp",
		"FOO_PORT_80_TCP_PORT=80",
		"FOO_PORT_80_TCP_ADDR=10.96.0.50",
	}
	myDB := []string{
		"MY_DB_SERVICE_HOST=10.96.0.51",
		"MY_DB_SERVICE_PORT=5432",
		"MY_DB_SERVICE_PORT_SQL=5432",
		"MY_DB_SERVICE_PORT_DNS=53",
		"MY_DB_PORT=tcp://10.96.0.51:5432",
		"MY_DB_PORT_5432_TCP=tcp://10.96.0.51:5432",
		"MY_DB_PORT_5432_TCP_PROTO=tcp",
		"MY_DB_PORT_5432_TCP_PORT=5432",
		"MY_DB_PORT_5432_TCP_ADDR=10.96.0.51",
		"MY_DB_PORT_53_UDP=udp://10.96.0.51:53",
		"MY_DB_PORT_53_UDP_PROTO=udp",
		"MY_DB_PORT_53_UDP_PORT=53",
		"MY_DB_PORT_53_UDP_ADDR=10.96.0.51",
	}
	web := []string{
		"WEB_SERVICE_HOST=10.96.0.70",
		"WEB_SERVICE_PORT=8080",
		"WEB_PORT=tcp://10.96.0.70:8080",
		"WEB_PORT_8080_TCP=tcp://10.96.0.70:8080",
		"WEB_PORT_8080_TCP_PROTO=tcp",
		"WEB_PORT_8080_TCP_PORT=8080",
		"WEB_PORT_8080_TCP_ADDR=10.96.0.70",
	}
	shadow := []string{
		"KUBERNETES_SERVICE_HOST=10.96.0.80",
		"KUBERNETES_SERVICE_PORT=6443",
		"KUBERNETES_PORT=tcp://10.96.0.80:6443",
		"KUBERNETES_PORT_6443_TCP=tcp://10.96.0.80:6443",
		"KUBERNETES_PORT_6443_TCP_PROTO=tcp",
		"KUBERNETES_PORT_6443_TCP_PORT=6443",
		"KUBERNETES_PORT_6443_TCP_ADDR=10.96.0.80",
	}
	cases := []struct {
		name        string
		namespace   string // "ns" unless set
		links       *bool
		serviceCIDR string // "10.96.0.0/16" unless set; "-" for not known yet
		lister      corelisters.ServiceLister
		env         []corev1.EnvVar
		want        []string
	}{
		{name: "links by default", lister: lister, want: slices.Concat(foo, kubernetes, myDB)},
		{name: "links asked for", links: ptr(true), lister: lister, want: slices.Concat(foo, kubernetes, myDB)},
		{name: "links refused: the kubernetes Service only", links: ptr(false), lister: lister, want: kubernetes},
		{name: "no Service lister: the kubernetes Service only", want: kubernetes},
		{name: "a pod of default sees default's Services", namespace: "default", lister: lister, want: slices.Concat(kubernetes, web)},
		{name: "a namespace's kubernetes Service wins", namespace: "shadow", lister: lister, want: shadow},
		{name: "but not when links are refused", namespace: "shadow", links: ptr(false), lister: lister, want: kubernetes},
		{name: "a headless kubernetes Service hides nothing", namespace: "headless-shadow", lister: lister, want: kubernetes},
		{name: "a namespace without Services", namespace: "empty", lister: lister, want: kubernetes},
		{name: "service CIDR not known yet", serviceCIDR: "-", lister: lister, want: slices.Concat(foo, myDB)},
		{name: "the container's own variables win", lister: lister,
			env: []corev1.EnvVar{
				{Name: "FOO_SERVICE_HOST", Value: "foo.example"},
				{Name: "URL", Value: "http://$(FOO_SERVICE_HOST):$(FOO_SERVICE_PORT)"},
				{Name: "KUBERNETES_SERVICE_HOST", Value: "api.example"},
			},
			want: slices.Concat([]string{"FOO_SERVICE_HOST=foo.example", "URL=http://foo.example:80", "KUBERNETES_SERVICE_HOST=api.example"},
				slices.Delete(slices.Clone(foo), 0, 1), slices.Delete(slices.Clone(kubernetes), 0, 1), myDB)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod()
			if tc.namespace != "" {
				pod.Namespace = tc.namespace
			}
			pod.Spec.EnableServiceLinks = tc.links
			cidr := tc.serviceCIDR
			switch cidr {
			case "":
				cidr = "10.96.0.0/16"
			case "-":
				cidr = ""
			}
			services, err := serviceEnv(pod, cidr, tc.lister)
			if err != nil {
				t.Fatal(err)
			}
			c := &corev1.Container{Name: "c", Env: tc.env}
			got, err := containerEnv(context.Background(), pod, c, &fakeObjects{}, nil, services)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("env:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func testService(namespace, name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports}}
}
