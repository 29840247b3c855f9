package apiserver

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// kindOf finds the registry entry for a decoded object.
func kindOf(obj runtime.Object) *kind {
	gvks, _, err := Scheme.ObjectKinds(obj)
	if err != nil {
		return nil
	}
	for _, k := range kinds {
		for _, gvk := range gvks {
			if gvk.GroupVersion() == k.gv && gvk.Kind == kindName(k) {
				return k
			}
		}
	}
	return nil
}

// FuzzDecodeValidate feeds arbitrary bytes through what a write meets before storage: decoding with the
// served scheme (JSON, YAML or protobuf), defaulting, validation, the table printer and the storage codec.
// Nothing may panic. `go test -fuzz FuzzDecodeValidate ./apiserver/` explores beyond the seeds.
func FuzzDecodeValidate(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}`))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"volumes":[{"name":"v","nfs":{"server":"x","path":"/"}}],"containers":[{"name":"c","image":"i","ports":[{"containerPort":99999}],"resources":{"limits":{"cpu":"1"},"requests":{"cpu":"2"}}}]}}`))
	f.Add([]byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"spec":{"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"c"}}}}}`))
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}]}\n"))
	f.Add([]byte{0x6b, 0x38, 0x73, 0x00, 0x0a, 0x02})
	decoder := Codecs.UniversalDeserializer()
	f.Fuzz(func(t *testing.T, data []byte) {
		obj, _, err := decoder.Decode(data, nil, nil)
		if err != nil {
			return
		}
		k := kindOf(obj)
		if k == nil {
			return
		}
		st := newStrategy(k)
		st.PrepareForCreate(context.Background(), obj)
		st.Validate(context.Background(), obj)
		st.ValidateUpdate(context.Background(), obj, obj.DeepCopyObject())
		cols := k.columns
		if cols == nil {
			cols = []column{nameColumn, ageColumn}
		}
		tableConvertor{columns: cols}.ConvertToTable(context.Background(), obj, nil)
		if gv, err := storageVersion(schema.GroupResource{Group: k.gv.Group, Resource: k.resource}); err == nil {
			codec := storageCodec(gv)
			if encoded, err := runtime.Encode(codec, obj); err == nil {
				runtime.Decode(codec, encoded)
			}
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			podStatus(pod)
		}
	})
}
