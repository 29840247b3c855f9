package memshare

import (
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
)

// testPod is a pod as a Deployment makes it and the agent reports it, with managed fields.
func testPod(i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("web-7d9c5b6f4-%05d", i), Namespace: "load-1", UID: "3f1c2a9e-0000-4000-8000-000000000001",
			Labels:      map[string]string{"app": "web", "pod-template-hash": "7d9c5b6f4"},
			Annotations: map[string]string{"kubernetes.io/config.seen": "2026-11-29T04:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9c5b6f4",
				UID: "11111111-2222-3333-4444-555555555555", Controller: new(true), BlockOwnerDeletion: new(true)}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{}},"f:ownerReferences":{}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:image":{},"f:name":{},"f:ports":{}}}}}`)}}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.k8s.io/pause:3.10",
				Env:   []corev1.EnvVar{{Name: "MODE", Value: "production"}, {Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}},
			}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: new(int64(300))}},
		},
	}
}

// versions returns the pod decoded from protobuf as it is stored at each step of its start: created,
// bound, then running.
func versions(t testing.TB, i int) [][]byte {
	pod := testPod(i)
	var out [][]byte
	codec := scheme.Codecs.CodecForVersions(protobufSerializer(t), nil, corev1.SchemeGroupVersion, nil)
	add := func() {
		data, err := k8sruntime.Encode(codec, pod)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data)
	}
	add()
	pod.Spec.NodeName = fmt.Sprintf("node-%d", i%500)
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
	add()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = "10.1.2.3"
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "registry.k8s.io/pause:3.10", ContainerID: "containerd://abc"}}
	pod.ManagedFields = append(pod.ManagedFields, metav1.ManagedFieldsEntry{Manager: "skiff-agent", Operation: metav1.ManagedFieldsOperationUpdate,
		APIVersion: "v1", FieldsType: "FieldsV1", Subresource: "status", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:phase":{},"f:podIP":{}}}`)}})
	add()
	return out
}

func decode(t testing.TB, data []byte) *corev1.Pod {
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, &corev1.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*corev1.Pod)
}

func TestWithKeepsValuesAndSharesWhatIsEqual(t *testing.T) {
	vs := versions(t, 1)
	prev := decode(t, vs[0])
	for _, data := range vs[1:] {
		cur, want := decode(t, data), decode(t, data)
		equal := With(cur, prev)
		if !reflect.DeepEqual(cur, want) {
			t.Fatalf("With changed the object's values")
		}
		if equal != reflect.DeepEqual(want, prev) {
			t.Fatalf("With said equal=%v", equal)
		}
		if unsafe.StringData(cur.Spec.Containers[0].Image) != unsafe.StringData(prev.Spec.Containers[0].Image) {
			t.Error("the unchanged image string is not shared")
		}
		if reflect.ValueOf(cur.Labels).UnsafePointer() != reflect.ValueOf(prev.Labels).UnsafePointer() {
			t.Error("the unchanged labels map is not shared")
		}
		if &cur.ManagedFields[0].FieldsV1.Raw[0] != &prev.ManagedFields[0].FieldsV1.Raw[0] {
			t.Error("the unchanged managed fields entry is not shared")
		}
		if cur.Spec.Containers[0].ReadinessProbe != prev.Spec.Containers[0].ReadinessProbe {
			t.Error("the unchanged probe is not shared")
		}
		prev = cur
	}
	// What changed is the new version's own.
	first := decode(t, vs[0])
	second := decode(t, vs[1])
	With(second, first)
	if second.Spec.NodeName == first.Spec.NodeName || len(second.Status.Conditions) == 0 {
		t.Fatal("the change was lost")
	}
}

func TestWithRefusesMismatchedArguments(t *testing.T) {
	if With(&corev1.Pod{}, &corev1.Node{}) || With(corev1.Pod{}, corev1.Pod{}) || With((*corev1.Pod)(nil), &corev1.Pod{}) {
		t.Fatal("With accepted arguments it cannot share")
	}
	empty := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{}}}
	if With(empty, &corev1.Pod{}) {
		t.Fatal("an empty list and no list are not equal")
	}
}

// BenchmarkHeldVersions measures what three versions of each of 5,000 pods hold on the heap, decoded each on
// its own and decoded then shared with the version before, and the time With takes per version.
func BenchmarkHeldVersions(b *testing.B) {
	const pods = 5000
	var stored [][][]byte
	for i := range pods {
		stored = append(stored, versions(b, i))
	}
	for _, shared := range []bool{false, true} {
		b.Run(fmt.Sprintf("shared=%v", shared), func(b *testing.B) {
			var held []*corev1.Pod
			for b.Loop() {
				held = nil
				runtime.GC()
				var before runtime.MemStats
				runtime.ReadMemStats(&before)
				for _, vs := range stored {
					var prev *corev1.Pod
					for _, data := range vs {
						cur := decode(b, data)
						if shared && prev != nil {
							With(cur, prev)
						}
						held = append(held, cur)
						prev = cur
					}
				}
				runtime.GC()
				var after runtime.MemStats
				runtime.ReadMemStats(&after)
				b.ReportMetric((float64(after.HeapAlloc)-float64(before.HeapAlloc))/float64(len(held)), "heap-B/version")
			}
			runtime.KeepAlive(held)
		})
	}
}

func protobufSerializer(t testing.TB) k8sruntime.Encoder {
	info, ok := k8sruntime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), k8sruntime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	return info.Serializer
}
