package manifests

import (
	"bytes"
	"fmt"
	"reflect"

	yaml "go.yaml.in/yaml/v3"
)

// identityKeys are the keys a strategic merge finds a list's item by: name
// for containers, volumes and env, mountPath for volumeMounts,
// containerPort for ports. A patch of an item keeps them.
var identityKeys = []string{"name", "mountPath", "containerPort"}

// strategicPatch returns the strategic-merge patch that turns off into on,
// two renderings of one object: what on adds or changes, lists of named
// maps merged by name as Kubernetes merges containers and volumes, with
// the object's apiVersion, kind, name and namespace. Comments of what it
// keeps stay. It fails if on lacks a key or a named item that off has: a
// patch that only adds cannot say that.
func strategicPatch(off, on string) ([]byte, error) {
	var offDoc, onDoc yaml.Node
	if err := yaml.Unmarshal([]byte(off), &offDoc); err != nil {
		return nil, err
	}
	if err := yaml.Unmarshal([]byte(on), &onDoc); err != nil {
		return nil, err
	}
	offRoot, onRoot := offDoc.Content[0], onDoc.Content[0]
	d, err := diffNode(offRoot, onRoot, "")
	if err != nil {
		return nil, err
	}
	if d == nil {
		return nil, nil
	}
	patch := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range []string{"apiVersion", "kind"} {
		patch.Content = append(patch.Content, scalar(k), scalar(lookup(onRoot, k).Value))
	}
	// The namespace too: kustomize finds a patch's target by the namespace
	// its file names, before a kustomization sets another.
	meta := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range []string{"name", "namespace"} {
		if v := lookup(lookup(onRoot, "metadata"), k); v != nil {
			meta.Content = append(meta.Content, scalar(k), scalar(v.Value))
		}
	}
	if m := lookup(d, "metadata"); m != nil {
		for i := 0; i < len(m.Content); i += 2 {
			if k := m.Content[i].Value; k != "name" && k != "namespace" {
				meta.Content = append(meta.Content, m.Content[i], m.Content[i+1])
			}
		}
	}
	patch.Content = append(patch.Content, scalar("metadata"), meta)
	for i := 0; i < len(d.Content); i += 2 {
		switch d.Content[i].Value {
		case "apiVersion", "kind", "metadata":
		default:
			patch.Content = append(patch.Content, d.Content[i], d.Content[i+1])
		}
	}
	dropFootComments(patch)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(patch); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// dropFootComments clears the comments below each node of n: in the
// rendered object they lead to what follows, which a patch leaves out.
func dropFootComments(n *yaml.Node) {
	n.FootComment = ""
	for _, c := range n.Content {
		dropFootComments(c)
	}
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }

// lookup returns the value of key in the map m, nil if m is no map or
// lacks it.
func lookup(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// diffNode returns what on adds to or changes in off at path, nil if
// nothing. A map keeps the keys whose values differ, a list of named maps
// the items that differ (each with its identityKeys); any other value that
// differs is on's whole, as a strategic merge replaces it.
func diffNode(off, on *yaml.Node, path string) (*yaml.Node, error) {
	if equal(off, on) {
		return nil, nil
	}
	switch {
	case off.Kind == yaml.MappingNode && on.Kind == yaml.MappingNode:
		for i := 0; i < len(off.Content); i += 2 {
			if lookup(on, off.Content[i].Value) == nil {
				return nil, fmt.Errorf("%s.%s is removed: a patch cannot say it", path, off.Content[i].Value)
			}
		}
		out := *on
		out.Content = nil
		for i := 0; i < len(on.Content); i += 2 {
			k, v := on.Content[i], on.Content[i+1]
			was := lookup(off, k.Value)
			if was == nil {
				out.Content = append(out.Content, k, v)
				continue
			}
			d, err := diffNode(was, v, path+"."+k.Value)
			if err != nil {
				return nil, err
			}
			if d != nil {
				out.Content = append(out.Content, k, d)
			}
		}
		return &out, nil
	case named(off) && named(on):
		byName := map[string]*yaml.Node{}
		for _, it := range on.Content {
			byName[lookup(it, "name").Value] = it
		}
		offByName := map[string]*yaml.Node{}
		for _, it := range off.Content {
			n := lookup(it, "name").Value
			if byName[n] == nil {
				return nil, fmt.Errorf("%s[%s] is removed: a patch cannot say it", path, n)
			}
			offByName[n] = it
		}
		out := *on
		out.Content = nil
		for _, it := range on.Content {
			n := lookup(it, "name").Value
			was := offByName[n]
			if was == nil {
				out.Content = append(out.Content, it)
				continue
			}
			d, err := diffNode(was, it, path+"["+n+"]")
			if err != nil {
				return nil, err
			}
			if d == nil {
				continue
			}
			var ids []*yaml.Node
			for _, k := range identityKeys {
				if v := lookup(it, k); v != nil && lookup(d, k) == nil {
					ids = append(ids, scalar(k), v)
				}
			}
			d.Content = append(ids, d.Content...)
			out.Content = append(out.Content, d)
		}
		return &out, nil
	}
	return on, nil
}

// named says whether n is a list of maps that each have a name.
func named(n *yaml.Node) bool {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		return false
	}
	for _, it := range n.Content {
		if v := lookup(it, "name"); v == nil || v.Kind != yaml.ScalarNode {
			return false
		}
	}
	return true
}

// equal says whether a and b hold the same value, whatever their style
// and comments.
func equal(a, b *yaml.Node) bool {
	var va, vb any
	if a.Decode(&va) != nil || b.Decode(&vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}
